#ifndef LOOM_PLAN_CALIBRATE_H_
#define LOOM_PLAN_CALIBRATE_H_

// //train:plan -- --calibrate: measures this machine and returns a hardware
// file (plan/hardware.proto, text format), every rate through core/ops (the
// kernels the trainer runs, chosen for this CPU at run time):
//   - the GEMM curve from a GPT layer's linear GEMMs in the three forms a
//     linear layer runs them (forward x·wᵀ, dX = dY·w, dW += dYᵀ·x), at
//     hidden sizes 64 .. 1024: on a CPU the weight gradient's transposed A
//     can run at half the forward's rate, which square GEMMs never show;
//   - flash attention's rate by size (attention_curve) and its backward over
//     its forward (attention_backward_ratio);
//   - Adam's rate over its bytes (optimizer_bandwidth);
//   - a memcpy (memory_bandwidth: also the element-wise kernels' rate; one
//     GPT-2 layer's LayerNorm, bias, GELU and residual kernels timed alone ran
//     2.5-3x faster per byte than the same kernels inside a training step on
//     the AMD EPYC of 2026-12-07, the memcpy within 20 %: so the file leaves
//     elementwise_bandwidth to hand-written files), and the local backend's all-reduce /
//     all-gather / reduce-scatter / all-to-all between two ranks (threads)
//     at 8 B and 4 MiB (latency, bus bandwidth).
// plan/testdata/cpu.textproto is its output on the machine named there.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "plan/hardware.h"

namespace loom::plan {

absl::StatusOr<std::string> Calibrate();

// What Calibrate times, seconds per call (sustained windows; calibrate.cc).
struct CpuTimes {
  double peak_flops = 0;  // the fastest GEMM's FLOP/s
  // (h, one set of a layer's 4 linear GEMMs × 3 forms at T = max(256, h) tokens).
  std::vector<std::pair<int64_t, double>> layer_gemms;
  struct Attention {
    int64_t seq = 0, heads = 0, head_dim = 0;  // b = 1, causal
    double forward = 0, backward = 0;
  };
  std::vector<Attention> attention;
  int64_t optimizer_elements = 4 << 20;
  double optimizer = 0;  // gradient norm + Adam over optimizer_elements f32 values
};

// The hardware file's rates from those times (the arithmetic, tested alone):
//   gemm_efficiency at each h: the set's FLOPs (3 × 2·T·h²·12) over its time,
//     over peak, at the set's mean GEMM (2·T·h²·3), capped at 1
//   attention_curve: causal FLOPs 2·s²·heads·d / forward time / peak
//   attention_backward_ratio: mean backward / forward
//   optimizer_bandwidth = elements · 32 B (the model's 7·4 + 4) / time
struct CpuRates {
  double peak_flops = 0;
  std::vector<GemmPoint> gemm_efficiency, attention_efficiency;
  double attention_backward_ratio = 0, optimizer_bandwidth = 0;
};
CpuRates CpuRatesFromTimes(const CpuTimes& times);

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
