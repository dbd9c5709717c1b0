// Row-wise softmax over the last dim: one block per row.

#include <cmath>

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

// Each pass recomputes exp(x - max) from x (no 16-bit round trip), and the
// last pass reads x[j] before writing out[j] in the same thread: in place is safe.
template <typename T>
__global__ void SoftmaxForwardKernel(const T* x, T* out, int64_t c) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * c;
  T* orow = out + row * c;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) mx = fmaxf(mx, Load(xr, j));
  mx = BlockReduce(mx, MaxOp(), smem);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += expf(Load(xr, j) - mx);
  const float inv = 1.0f / BlockReduce(sum, SumOp(), smem);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    orow[j] = FromFloat<T>(expf(Load(xr, j) - mx) * inv);
  }
}

// dx = y (dout - sum(y dout)); dx may alias dout (read before written, same thread).
template <typename T>
__global__ void SoftmaxBackwardKernel(const T* y, const T* dout, T* dx, int64_t c) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * c;
  const T* dr = dout + row * c;
  T* gr = dx + row * c;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dot += Load(yr, j) * Load(dr, j);
  dot = BlockReduce(dot, SumOp(), smem);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    gr[j] = FromFloat<T>(Load(yr, j) * (Load(dr, j) - dot));
  }
}

}  // namespace

cudaError_t SoftmaxForward(Elem t, const void* x, void* out, int64_t rows, int64_t c,
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      SoftmaxForwardKernel<T><<<RowGrid(rows), RowThreads(c), 0, stream>>>(
                          static_cast<const T*>(x), static_cast<T*>(out), c));
  return cudaGetLastError();
}

cudaError_t SoftmaxBackward(Elem t, const void* out, const void* dout, void* dx, int64_t rows,
                            int64_t c, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      SoftmaxBackwardKernel<T><<<RowGrid(rows), RowThreads(c), 0, stream>>>(
                          static_cast<const T*>(out), static_cast<const T*>(dout),
                          static_cast<T*>(dx), c));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
