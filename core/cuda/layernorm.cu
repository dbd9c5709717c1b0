// LayerNorm and RMSNorm over the last dim: one block per row, statistics in
// f32. One kernel template serves both: kCentered is LayerNorm (mean
// subtracted, beta added); without it RMSNorm (mean 0, no beta).

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <typename T, bool kCentered>
__global__ void NormForwardKernel(const T* x, const T* gamma, const T* beta, float eps, int64_t c,
                                  T* out, float* mean, float* rstd) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * c;
  T* orow = out + row * c;
  const float inv_c = 1.0f / static_cast<float>(c);
  // Two passes (mean, then centred squares) as the CPU does: no cancellation.
  float m = 0.0f, acc = 0.0f;
  if (kCentered) {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) acc += Load(xr, j);
    m = BlockReduce(acc, SumOp(), smem) * inv_c;
    acc = 0.0f;
  }
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = Load(xr, j) - m;
    acc += d * d;
  }
  const float var = BlockReduce(acc, SumOp(), smem);
  const float s = 1.0f / sqrtf(var * inv_c + eps);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float y = (Load(xr, j) - m) * s * Load(gamma, j);
    orow[j] = FromFloat<T>(kCentered ? y + Load(beta, j) : y);
  }
  if (threadIdx.x == 0) {
    if (kCentered) mean[row] = m;
    rstd[row] = s;
  }
}

// dx = s (g dout - mean(g dout) - n mean(g dout n)), n = (x - m) s; RMSNorm
// has m = 0 and no mean(g dout) term. Each thread reads dout[j] before
// writing dx[j] (after both reductions), so dx may alias dout.
template <typename T, bool kCentered>
__global__ void NormBackwardDxKernel(const T* dout, const T* x, const T* gamma, const float* mean,
                                     const float* rstd, int64_t c, T* dx) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* dr = dout + row * c;
  const T* xr = x + row * c;
  T* dxr = dx + row * c;
  const float m = kCentered ? mean[row] : 0.0f, s = rstd[row];
  const float inv_c = 1.0f / static_cast<float>(c);
  float a = 0.0f, b = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float dn = Load(gamma, j) * Load(dr, j);
    a += dn;
    b += dn * ((Load(xr, j) - m) * s);
  }
  const float mean_dn = kCentered ? BlockReduce(a, SumOp(), smem) * inv_c : 0.0f;
  const float mean_dn_n = BlockReduce(b, SumOp(), smem) * inv_c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float n = (Load(xr, j) - m) * s;
    dxr[j] = FromFloat<T>(s * (Load(gamma, j) * Load(dr, j) - mean_dn - n * mean_dn_n));
  }
}

template <bool kCentered>
cudaError_t NormForward(Elem t, const void* x, const void* gamma, const void* beta, float eps,
                        int64_t rows, int64_t c, void* out, float* mean, float* rstd,
                        cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      NormForwardKernel<T, kCentered><<<RowGrid(rows), RowThreads(c), 0, stream>>>(
                          static_cast<const T*>(x), static_cast<const T*>(gamma),
                          static_cast<const T*>(beta), eps, c, static_cast<T*>(out), mean, rstd));
  return cudaGetLastError();
}

template <bool kCentered>
cudaError_t NormBackwardDx(Elem t, const void* dout, const void* x, const void* gamma,
                           const float* mean, const float* rstd, int64_t rows, int64_t c, void* dx,
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(
      t, T,
      NormBackwardDxKernel<T, kCentered><<<RowGrid(rows), RowThreads(c), 0, stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(x), static_cast<const T*>(gamma),
          mean, rstd, c, static_cast<T*>(dx)));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LayerNormForward(Elem t, const void* x, const void* gamma, const void* beta, float eps,
                             int64_t rows, int64_t c, void* out, float* mean, float* rstd,
                             cudaStream_t stream) {
  return NormForward<true>(t, x, gamma, beta, eps, rows, c, out, mean, rstd, stream);
}

cudaError_t LayerNormBackwardDx(Elem t, const void* dout, const void* x, const void* gamma,
                                const float* mean, const float* rstd, int64_t rows, int64_t c,
                                void* dx, cudaStream_t stream) {
  return NormBackwardDx<true>(t, dout, x, gamma, mean, rstd, rows, c, dx, stream);
}

cudaError_t RmsNormForward(Elem t, const void* x, const void* gamma, float eps, int64_t rows,
                           int64_t c, void* out, float* rstd, cudaStream_t stream) {
  return NormForward<false>(t, x, gamma, nullptr, eps, rows, c, out, nullptr, rstd, stream);
}

cudaError_t RmsNormBackwardDx(Elem t, const void* dout, const void* x, const void* gamma,
                              const float* rstd, int64_t rows, int64_t c, void* dx,
                              cudaStream_t stream) {
  return NormBackwardDx<false>(t, dout, x, gamma, nullptr, rstd, rows, c, dx, stream);
}

}  // namespace loom::core::cuda::kernels
