#ifndef LOOM_CORE_CUDA_DEVICE_UTIL_CUH_
#define LOOM_CORE_CUDA_DEVICE_UTIL_CUH_

// Shared device code of the *.cu files: element loads/stores in f32,
// block reductions, launch shapes and dtype dispatch.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/kernels.h"

namespace loom::core::cuda::kernels {

// Arithmetic always happens in f32; 16-bit types are storage only.
__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ int64_t LoadIndex(const void* p, Index it, int64_t i) {
  return it == Index::kI32 ? static_cast<int64_t>(static_cast<const int32_t*>(p)[i])
                           : static_cast<const int64_t*>(p)[i];
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `smem` holds 32 floats. Safe to call repeatedly
// with the same smem (the leading barrier protects the previous readers).
// The order of additions is fixed: results are deterministic.
template <typename Op>
__device__ __forceinline__ float BlockReduce(float v, Op op, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float r = smem[0];
  for (int w = 1; w < warps; ++w) r = op(r, smem[w]);
  return r;
}

// Threads per block for one row of c elements: enough for a few elements
// each, a multiple of 32.
inline int RowThreads(int64_t c) {
  if (c >= 4096) return 512;
  if (c >= 512) return 256;
  const int64_t t = (c + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : t > 256 ? 256 : t);
}

// Grid for a grid-stride loop over n elements.
inline int FlatBlocks(int64_t n, int threads = 256) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

// Grid x for one block per row: rows up to 2^31 - 1 (checked by callers).
inline dim3 RowGrid(int64_t rows) { return dim3(static_cast<unsigned>(rows)); }

}  // namespace loom::core::cuda::kernels

// Calls body with `T` bound to the element type of `elem` (f32 or bf16;
// f16 where `with_f16`); returns cudaErrorInvalidValue for others.
#define LOOM_DISPATCH_FLOAT(elem, T, ...)                                   \
  do {                                                                      \
    switch (elem) {                                                         \
      case ::loom::core::cuda::kernels::Elem::kF32: {                       \
        using T = float;                                                    \
        __VA_ARGS__;                                                        \
        break;                                                              \
      }                                                                     \
      case ::loom::core::cuda::kernels::Elem::kBF16: {                      \
        using T = __nv_bfloat16;                                            \
        __VA_ARGS__;                                                        \
        break;                                                              \
      }                                                                     \
      default:                                                              \
        return cudaErrorInvalidValue;                                       \
    }                                                                       \
  } while (0)

#endif  // LOOM_CORE_CUDA_DEVICE_UTIL_CUH_
