#ifndef LOOM_CORE_CUDA_RESIDUAL_NORM_KERNELS_H_
#define LOOM_CORE_CUDA_RESIDUAL_NORM_KERNELS_H_

// Launchers of residual_norm.cu (core/cuda/residual_norm.h is the API).
// Plain types only (nvcc never parses Abseil).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/kernels.h"

namespace loom::core::cuda::kernels {

struct ResidualNormParams {
  int64_t rows = 0, c = 0;
  float eps = 1e-5f;
  bool rms = false;
  // Dropout of the branch (dropout false: none). Global index of element
  // (r, j) is first + r * stride + j.
  bool dropout = false;
  uint64_t seed = 0, offset = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
  int64_t first = 0, stride = 0;
};

// resid = T(x + T(dropout(branch))), out = Norm(resid) (statistics in f32 from
// the rounded resid, as the unfused kernels see it); mean (LayerNorm), rstd f32.
// resid may alias x or branch. One block per row, 16-byte loads where a row's
// pointers allow, a scalar tail.
cudaError_t ResidualNormForward(Elem t, const void* x, const void* branch, const void* gamma,
                                const void* beta, void* resid, void* out, float* mean, float* rstd,
                                const ResidualNormParams& p, cudaStream_t stream);

// dx = T(T(Norm'(dout)) + dresid); dbranch (may be null) = T(dropout'(dx)).
// dgamma/dbeta are ColumnPartials' (kernels.h). dx may alias dout or dresid.
cudaError_t ResidualNormBackwardDx(Elem t, const void* dout, const void* dresid, const void* resid,
                                   const void* gamma, const float* mean, const float* rstd,
                                   void* dx, void* dbranch, const ResidualNormParams& p,
                                   cudaStream_t stream);

}  // namespace loom::core::cuda::kernels

#endif  // LOOM_CORE_CUDA_RESIDUAL_NORM_KERNELS_H_
