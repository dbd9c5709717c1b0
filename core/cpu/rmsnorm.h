#ifndef LOOM_CORE_CPU_RMSNORM_H_
#define LOOM_CORE_CPU_RMSNORM_H_

// RMSNorm over the last dimension (Llama: no mean, no bias; eps 1e-5 or
// 1e-6). See elementwise.h for the backward conventions (dx overwritten,
// dgamma accumulated).

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// out = (x * rstd) * gamma, row-wise, rstd = 1 / sqrt(mean(x^2) + eps)
// (Hugging Face's LlamaRMSNorm, in that order); saves rstd.
//   x:     f32[..., C]  (rows N = numel / C)
//   gamma: f32[C]
//   out:   f32[same as x]
//   rstd:  f32[N] (any shape with N elements), written
absl::Status RmsNormForward(const Tensor& x, const Tensor& gamma, float eps, Tensor* out,
                            Tensor* rstd);

// With n = x * rstd: dx = rstd * (gamma dout - n * mean(gamma dout n)),
// dgamma += sum over rows of dout * n.
//   dout:   f32[..., C]
//   x:      f32[..., C] (the forward input)
//   gamma:  f32[C]
//   rstd:   f32[N] from the forward
//   dx:     f32[..., C] written (may alias dout)
//   dgamma: f32[C] accumulated
absl::Status RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                             const Tensor& rstd, Tensor* dx, Tensor* dgamma);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_RMSNORM_H_
