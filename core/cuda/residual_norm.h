#ifndef LOOM_CORE_CUDA_RESIDUAL_NORM_H_
#define LOOM_CORE_CUDA_RESIDUAL_NORM_H_

// GPU twin of core/cpu/residual_norm.h: the residual add (with the branch's
// dropout, masks bit for bit the CPU's) and the norm after it in one kernel
// each way. x, branch, gamma, beta, resid, out (dout, dresid, dx, dbranch)
// share one dtype (f32 or bf16); mean and rstd f32; dgamma/dbeta f32 or that
// dtype (accumulated, deterministic fixed-order sums).

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cuda {

// resid may alias x or branch.
absl::Status ResidualNormForward(const Tensor& x, const Tensor& branch, const Tensor& gamma,
                                 const Tensor& beta, const ops::ResidualNormOptions& o,
                                 Tensor* resid, Tensor* out, Tensor* mean, Tensor* rstd);

// dx may alias dout or dresid; dbranch may be null.
absl::Status ResidualNormBackward(const Tensor& dout, const Tensor& dresid, const Tensor& resid,
                                  const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                  const ops::ResidualNormOptions& o, Tensor* dx, Tensor* dbranch,
                                  Tensor* dgamma, Tensor* dbeta);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_RESIDUAL_NORM_H_
