#ifndef LOOM_CORE_CPU_LINEAR_H_
#define LOOM_CORE_CPU_LINEAR_H_

// A linear layer's GEMMs with their epilogues (the contract of op_list.h's
// LinearForward, LinearBackwardData, LinearBackwardWeight; checks in
// core/ops/contracts/shape_checks.h). On the CPU each is exactly the unfused
// sequence of Matmul, BiasAdd and GELU kernels the layers ran before, so the
// results are bitwise the unfused path's: the CPU contract a fused device
// kernel (core/cuda/linear.h, cuBLASLt epilogues) is tested against.
// Row-major; f32 (w may be bf16, or opts.bf16 set: core/cpu/matmul.h's bf16
// GEMM mode).

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::LinearOptions;

// z = x·wᵀ + bias; y = z, or with opts.gelu y = gelu(z) and pre = z.
//   x: [N, K]; w: [M, K]; bias: [M]; y: [N, M]; pre: [N, M] with gelu, else null
absl::Status LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor* y,
                           Tensor* pre, const LinearOptions& opts);

// dx = dy·w, with opts.gelu dx = gelu'(pre) ⊙ (dy·w); dbias += Σ_rows dx.
//   dy: [N, M]; w: [M, K]; pre: [N, K] (read with gelu); dx: [N, K] (overwritten);
//   dbias: [K] (accumulated; null: none; needs gelu)
absl::Status LinearBackwardData(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor* dx,
                                Tensor* dbias, const LinearOptions& opts);

// dw += dyᵀ·x; dbias += Σ_rows dy.
//   dy: [N, M]; x: [N, K]; dw: [M, K] (accumulated); dbias: [M] (accumulated; null: none)
absl::Status LinearBackwardWeight(const Tensor& dy, const Tensor& x, Tensor* dw, Tensor* dbias,
                                  const LinearOptions& opts);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_LINEAR_H_
