#ifndef LOOM_TRAIN_TEST_UTIL_H_
#define LOOM_TRAIN_TEST_UTIL_H_

// Tiny training runs over the `local` backend (ranks are threads), shared by
// the trainer's equivalence test and the checkpoint tests.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train::testing {

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int vp_layers = 0;  // --num-layers-per-virtual-pipeline-stage
  bool sp = false;
  bool distributed = false;
  std::string schedule = "1f1b";
  bool overlap = false;  // --overlap-grad-reduce
  bool param_gather = false;  // --overlap-param-gather
  std::string Describe() const;
};

// A small learnable corpus under TEST_TMPDIR (built once per process).
std::string Dataset();

// The tiny model every checkpoint test trains: 4 layers, hidden 32, 4 heads.
train::TrainConfig TinyConfig(const Layout& layout, int64_t train_iters);
// TinyConfig made Llama-style: RMSNorm, RoPE, SwiGLU (ffn 64), 2 query groups
// of the 4 heads, untied output layer, no linear biases.
train::TrainConfig TinyLlamaConfig(const Layout& layout, int64_t train_iters);

struct RunResult {
  absl::Status status;          // the lowest failing rank's ("rank r: ...")
  std::vector<double> losses;   // rank 0's (every step this run took)
};
// Creates a Trainer on every rank of a local world (ranks as threads,
// //comm/testing:ranks_as_threads) and runs Train().
RunResult Run(const train::TrainConfig& config, const Layout& layout);

}  // namespace loom::train::testing

#endif  // LOOM_TRAIN_TEST_UTIL_H_
