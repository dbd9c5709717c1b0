#ifndef LOOM_CORE_CUDA_LAYERNORM_H_
#define LOOM_CORE_CUDA_LAYERNORM_H_

// GPU twin of core/cpu/layernorm.h. x, gamma, beta, out, dout, dx share one
// dtype (f32 or bf16); mean and rstd are always f32; dgamma/dbeta are f32 or
// that dtype (accumulated, deterministic fixed-order sums).

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   x: [..., C] (N rows); gamma, beta: [C]; out like x; mean, rstd: f32[N], written
absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd);

//   dx written (may alias dout); dgamma, dbeta accumulated
absl::Status LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_LAYERNORM_H_
