#ifndef LOOM_CORE_CPU_RESIDUAL_NORM_H_
#define LOOM_CORE_CPU_RESIDUAL_NORM_H_

// The transformer block's residual path fused with the norm after it
// (ops::ResidualNormOptions, core/ops/contracts/options.h). On the CPU the
// unfused kernels composed in the unfused path's order (DropoutForward, Add,
// LayerNorm/RmsNormForward; their backwards, Add, DropoutBackward): results
// are bit-identical to that path, and this is the oracle of the CUDA kernels.

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::ResidualNormOptions;

// resid = x + dropout(branch) (mask at o.where, none when o.dropout.p == 0);
// out = LayerNorm(resid; gamma, beta) keeping mean and rstd, or
// RMSNorm(resid; gamma) keeping rstd (o.rms: beta undefined, mean null).
//   x, branch, resid, out: f32[..., C] (rows N); resid may alias x or branch
//   gamma, beta: f32[C]; mean, rstd: f32[N], written
absl::Status ResidualNormForward(const Tensor& x, const Tensor& branch, const Tensor& gamma,
                                 const Tensor& beta, const ResidualNormOptions& o, Tensor* resid,
                                 Tensor* out, Tensor* mean, Tensor* rstd);

// dx = Norm'(dout) + dresid (the gradient of the forward's x: the norm's
// input gradient plus the residual one); dbranch (optional, may be null) =
// dropout'(dx), the gradient of the forward's branch; dgamma (and LayerNorm's
// dbeta) accumulated.
//   dout, dresid, resid (the forward's), dx, dbranch: f32[..., C]; dx may
//   alias dout or dresid
//   mean (LayerNorm; undefined for RMSNorm), rstd: f32[N] from the forward
absl::Status ResidualNormBackward(const Tensor& dout, const Tensor& dresid, const Tensor& resid,
                                  const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                  const ResidualNormOptions& o, Tensor* dx, Tensor* dbranch,
                                  Tensor* dgamma, Tensor* dbeta);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_RESIDUAL_NORM_H_
