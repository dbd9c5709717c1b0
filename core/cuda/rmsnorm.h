#ifndef LOOM_CORE_CUDA_RMSNORM_H_
#define LOOM_CORE_CUDA_RMSNORM_H_

// GPU twin of core/cpu/rmsnorm.h. x, gamma, out, dout, dx share one dtype
// (f32 or bf16); rstd is always f32; dgamma is f32 or that dtype
// (accumulated, deterministic fixed-order sums).

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   x: [..., C] (N rows); gamma: [C]; out like x; rstd: f32[N], written
absl::Status RmsNormForward(const Tensor& x, const Tensor& gamma, float eps, Tensor* out,
                            Tensor* rstd);

//   dx written (may alias dout); dgamma accumulated
absl::Status RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                             const Tensor& rstd, Tensor* dx, Tensor* dgamma);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_RMSNORM_H_
