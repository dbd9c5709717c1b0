#ifndef LOOM_PLAN_CALIBRATE_H_
#define LOOM_PLAN_CALIBRATE_H_

// //train:plan -- --calibrate: measures this machine and returns a hardware
// file (plan/hardware.proto, text format): f32 GEMMs of growing size through
// core/ops (the kernels the trainer runs), a memcpy, and the local backend's
// all-reduce / all-gather / reduce-scatter / all-to-all / send-recv between
// two ranks (threads) at 4 B and 4 MiB (latency, bus bandwidth).
// plan/testdata/cpu.textproto is its output on this machine.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "plan/hardware.h"

namespace loom::plan {

absl::StatusOr<std::string> Calibrate();

// One GEMM C(m, n) = A(m, k) · B(k, n).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};

// The GEMMs a GPT layer runs at 4096 tokens per micro-batch, for the hidden
// sizes of Megatron's H100 table split by TP 1 .. 8 (QKV, projection, MLP up
// and down), and square ones from 256 to 8192: 1e8 .. 1e13 FLOPs.
std::vector<GemmShape> DeviceGemmShapes();

// //train:plan -- --calibrate --device=cuda [--bf16] --hardware=BASE: `base`
// with its GEMM-efficiency curve and memory bandwidth measured on `device`
// (GEMMs of `shapes` in `dtype` through core/ops, the kernels the trainer
// runs; efficiency = achieved / base.peak_flops(), the datasheet peak, so MFU
// stays against it; points of equal FLOPs averaged, capped at 1; bandwidth:
// bytes read + written by a device-to-device copy of `copy_bytes`). Its other
// fields (links, attention efficiency) are base's, and `source` says which
// were measured. Each GEMM: the best of 3 timed runs of enough repetitions for
// about 20 ms, the device synchronized after each run.
absl::StatusOr<Hardware> CalibrateDevice(const Hardware& base, core::Device device,
                                         core::DType dtype, const std::vector<GemmShape>& shapes,
                                         int64_t copy_bytes);

}  // namespace loom::plan

#endif  // LOOM_PLAN_CALIBRATE_H_
