#ifndef LOOM_PLAN_CALIBRATE_H_
#define LOOM_PLAN_CALIBRATE_H_

// //train:plan -- --calibrate: measures this machine and returns a hardware
// file (plan/hardware.proto, text format): f32 GEMMs of growing size through
// core/ops (the kernels the trainer runs), a memcpy, and the local backend's
// all-reduce / all-gather / reduce-scatter / all-to-all / send-recv between
// two ranks (threads) at 4 B and 4 MiB (latency, bus bandwidth).
// plan/testdata/cpu.textproto is its output on this machine.

#include <string>

#include "absl/status/statusor.h"

namespace loom::plan {

absl::StatusOr<std::string> Calibrate();

}  // namespace loom::plan

#endif  // LOOM_PLAN_CALIBRATE_H_
