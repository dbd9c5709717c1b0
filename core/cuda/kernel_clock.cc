// Registers CUDA events as //core/ops's kernel clock for CUDA tensors, so a
// KernelTimer on the device (//train:bench's per-kernel table) reports each
// kernel's device time: an event recorded on the current stream before and
// after the call, read when the timer's totals are asked for.

#include <utility>

#include "core/cuda/event.h"
#include "core/ops/kernel_timer.h"

namespace loom::core::cuda {
namespace {

struct Mark {
  Event start, stop;
  bool ok = false;
};

void* Start() {
  auto* m = new Mark;
  absl::StatusOr<Event> e = Event::Create(/*timing=*/true);
  if (e.ok() && e->Record().ok()) {
    m->start = *std::move(e);
    m->ok = true;
  }
  return m;
}

void Stop(void* mark) {
  auto* m = static_cast<Mark*>(mark);
  absl::StatusOr<Event> e = Event::Create(/*timing=*/true);
  m->ok = m->ok && e.ok() && e->Record().ok();
  if (e.ok()) m->stop = *std::move(e);
}

double Seconds(void* mark) {
  auto* m = static_cast<Mark*>(mark);
  double s = 0;
  if (m->ok && m->stop.Synchronize().ok()) {
    absl::StatusOr<float> ms = m->stop.ElapsedMsSince(m->start);
    if (ms.ok()) s = *ms * 1e-3;
  }
  delete m;
  return s;
}

const ops::KernelClock kEventClock{&Start, &Stop, &Seconds};

[[maybe_unused]] const bool kRegistered = [] {
  ops::RegisterKernelClock(DeviceType::kCUDA, &kEventClock);
  return true;
}();

}  // namespace
}  // namespace loom::core::cuda
