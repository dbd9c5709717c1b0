#ifndef LOOM_CORE_CPU_LAYERNORM_H_
#define LOOM_CORE_CPU_LAYERNORM_H_

// LayerNorm over the last dimension (GPT-2: eps 1e-5). See elementwise.h for
// the backward conventions (dx overwritten, dgamma/dbeta accumulated).

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// out = (x - mean) * rstd * gamma + beta, row-wise; saves mean and rstd.
//   x:     f32[..., C]  (rows N = numel / C)
//   gamma: f32[C]
//   beta:  f32[C]
//   out:   f32[same as x]
//   mean:  f32[N] (any shape with N elements), written
//   rstd:  f32[N] 1 / sqrt(var + eps), biased variance, written
absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd);

//   dout:   f32[..., C]
//   x:      f32[..., C] (the forward input)
//   gamma:  f32[C]
//   mean, rstd: f32[N] from the forward
//   dx:     f32[..., C] written (may alias dout)
//   dgamma, dbeta: f32[C] accumulated
absl::Status LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_LAYERNORM_H_
