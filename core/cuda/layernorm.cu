// LayerNorm over the last dim: one block per row, statistics in f32.

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <typename T>
__global__ void LayerNormForwardKernel(const T* x, const T* gamma, const T* beta, float eps,
                                       int64_t c, T* out, float* mean, float* rstd) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * c;
  T* orow = out + row * c;
  const float inv_c = 1.0f / static_cast<float>(c);
  // Two passes (mean, then centred squares) as the CPU does: no cancellation.
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) acc += Load(xr, j);
  const float m = BlockReduce(acc, SumOp(), smem) * inv_c;
  acc = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = Load(xr, j) - m;
    acc += d * d;
  }
  const float var = BlockReduce(acc, SumOp(), smem);
  const float s = 1.0f / sqrtf(var * inv_c + eps);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    orow[j] = FromFloat<T>((Load(xr, j) - m) * s * Load(gamma, j) + Load(beta, j));
  }
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx = s (g dout - mean(g dout) - n mean(g dout n)), n = (x - m) s.
// Each thread reads dout[j] before writing dx[j] (after both reductions), so
// dx may alias dout.
template <typename T>
__global__ void LayerNormBackwardDxKernel(const T* dout, const T* x, const T* gamma,
                                          const float* mean, const float* rstd, int64_t c, T* dx) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* dr = dout + row * c;
  const T* xr = x + row * c;
  T* dxr = dx + row * c;
  const float m = mean[row], s = rstd[row];
  const float inv_c = 1.0f / static_cast<float>(c);
  float a = 0.0f, b = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float dn = Load(gamma, j) * Load(dr, j);
    a += dn;
    b += dn * ((Load(xr, j) - m) * s);
  }
  const float mean_dn = BlockReduce(a, SumOp(), smem) * inv_c;
  const float mean_dn_n = BlockReduce(b, SumOp(), smem) * inv_c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float n = (Load(xr, j) - m) * s;
    dxr[j] = FromFloat<T>(s * (Load(gamma, j) * Load(dr, j) - mean_dn - n * mean_dn_n));
  }
}

}  // namespace

cudaError_t LayerNormForward(Elem t, const void* x, const void* gamma, const void* beta, float eps,
                             int64_t rows, int64_t c, void* out, float* mean, float* rstd,
                             cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      LayerNormForwardKernel<T><<<RowGrid(rows), RowThreads(c), 0, stream>>>(
                          static_cast<const T*>(x), static_cast<const T*>(gamma),
                          static_cast<const T*>(beta), eps, c, static_cast<T*>(out), mean, rstd));
  return cudaGetLastError();
}

cudaError_t LayerNormBackwardDx(Elem t, const void* dout, const void* x, const void* gamma,
                                const float* mean, const float* rstd, int64_t rows, int64_t c,
                                void* dx, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      LayerNormBackwardDxKernel<T><<<RowGrid(rows), RowThreads(c), 0, stream>>>(
                          static_cast<const T*>(dout), static_cast<const T*>(x),
                          static_cast<const T*>(gamma), mean, rstd, c, static_cast<T*>(dx)));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
