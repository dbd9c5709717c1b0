// Writes a small event file with Loom's EventWriter into argv[1] (a folder),
// for tensorboard_reader_test.sh: TensorBoard's reader must read it back.
// Scalars: "lm loss" = 10 - step / 4 at steps 1..4, and "lm loss vs samples"
// the same at step 8 * step.

#include <cstdio>

#include "train/tensorboard/events.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_sample DIR\n");
    return 2;
  }
  auto w = loom::tensorboard::EventWriter::Open(argv[1]);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    return 1;
  }
  for (int step = 1; step <= 4; ++step) {
    const float loss = 10.0f - step / 4.0f;
    (*w)->AddScalar("lm loss", loss, step, 1700000000.0 + step);
    (*w)->AddScalar("lm loss vs samples", loss, 8 * step, 1700000000.0 + step);
  }
  const absl::Status s = (*w)->Flush();
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
