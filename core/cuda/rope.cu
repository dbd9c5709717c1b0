// Rotary position embedding (core/cpu/rope.h): a cos/sin table per call, then
// one thread per rotated pair or passed-through element.

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

// The CPU's angles: inv_freq and theta in f32 exactly as core/cpu/rope.cc
// computes them, pow and sincos in double and rounded once, so both devices
// use the same table (up to the double functions' last bits).
__global__ void RopeTableKernel(float base, int64_t r, int64_t offset, int64_t n, int64_t h,
                                float sign, float* cos_out, float* sin_out) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = k / h, i = k - s * h;
    const float e = static_cast<float>(2 * i) / static_cast<float>(r);
    const float inv_freq =
        1.0f / static_cast<float>(pow(static_cast<double>(base), static_cast<double>(e)));
    const float theta = static_cast<float>(s + offset) * inv_freq;
    double sv, cv;
    sincos(static_cast<double>(theta), &sv, &cv);
    cos_out[k] = static_cast<float>(cv);
    sin_out[k] = sign * static_cast<float>(sv);
  }
}

// Work item w < d - h of a row: w < h rotates the pair (w, w + h); w >= h
// copies dim w + h (in [r, d)) when not in place. A pair is read and written
// by one thread, so out may be x.
template <typename T>
__global__ void RopeApplyKernel(const T* x, const float* cos, const float* sin, int64_t n,
                                int64_t heads, int64_t d, int64_t h, bool copy_rest, T* out) {
  const int64_t per_row = d - h;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = k / per_row, w = k - row * per_row;
    const T* xr = x + row * d;
    T* orow = out + row * d;
    if (w < h) {
      const int64_t t = row / heads * h + w;
      const float c = cos[t], s = sin[t];
      const float x0 = Load(xr, w), x1 = Load(xr, w + h);
      orow[w] = FromFloat<T>(x0 * c - x1 * s);
      orow[w + h] = FromFloat<T>(x1 * c + x0 * s);
    } else if (copy_rest) {
      orow[w + h] = xr[w + h];
    }
  }
}

}  // namespace

cudaError_t RopeTable(float base, int64_t r, int64_t offset, int64_t seq, float sign, float* cos,
                      float* sin, cudaStream_t stream) {
  const int64_t n = seq * (r / 2);
  if (n == 0) return cudaSuccess;
  RopeTableKernel<<<FlatBlocks(n), 256, 0, stream>>>(base, r, offset, n, r / 2, sign, cos, sin);
  return cudaGetLastError();
}

cudaError_t RopeApply(Elem t, const void* x, const float* cos, const float* sin, int64_t rows,
                      int64_t heads, int64_t d, int64_t r, void* out, cudaStream_t stream) {
  const int64_t n = rows * (d - r / 2);
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(
      t, T,
      RopeApplyKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
          static_cast<const T*>(x), cos, sin, n, heads, d, r / 2, out != x, static_cast<T*>(out)));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
