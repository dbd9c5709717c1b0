// SwiGLU (core/cpu/swiglu.h): one thread per output column of a row.

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <typename T>
__global__ void SwigluForwardKernel(const T* x, int64_t n, int64_t f, T* out) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = k / f, j = k - row * f;
    const float g = Load(x, row * 2 * f + j), u = Load(x, row * 2 * f + f + j);
    out[k] = FromFloat<T>(g / (1.0f + expf(-g)) * u);
  }
}

// One thread reads gate and up of column j before writing both gradients,
// so dx may alias x.
template <typename T>
__global__ void SwigluBackwardKernel(const T* dout, const T* x, int64_t n, int64_t f, T* dx) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = k / f, j = k - row * f;
    const int64_t ig = row * 2 * f + j, iu = ig + f;
    const float g = Load(x, ig), u = Load(x, iu), d = Load(dout, k);
    const float s = 1.0f / (1.0f + expf(-g));
    dx[ig] = FromFloat<T>(d * u * (s * (1.0f + g * (1.0f - s))));
    dx[iu] = FromFloat<T>(d * (g * s));
  }
}

}  // namespace

cudaError_t SwigluForward(Elem t, const void* x, int64_t rows, int64_t f, void* out,
                          cudaStream_t stream) {
  const int64_t n = rows * f;
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      SwigluForwardKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
                          static_cast<const T*>(x), n, f, static_cast<T*>(out)));
  return cudaGetLastError();
}

cudaError_t SwigluBackward(Elem t, const void* dout, const void* x, int64_t rows, int64_t f,
                           void* dx, cudaStream_t stream) {
  const int64_t n = rows * f;
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(
      t, T,
      SwigluBackwardKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
          static_cast<const T*>(dout), static_cast<const T*>(x), n, f, static_cast<T*>(dx)));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
