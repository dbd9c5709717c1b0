// f32 <-> bf16 and f32 <-> f16, rounding exactly as core/cpu/convert.h.

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

// cpu::FloatToBf16Bits: round to nearest even; NaN -> quiet NaN keeping the
// sign and high payload (CUDA's __float2bfloat16_rn makes a canonical NaN).
__device__ __forceinline__ uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void F32ToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = FloatToBf16Bits(src[i]);
  }
}

__global__ void Bf16ToF32Kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
  }
}

// IEEE round to nearest even, as F16C's vcvtps2ph with _MM_FROUND_TO_NEAREST_INT.
__global__ void F32ToF16Kernel(const float* src, __half* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = __float2half_rn(src[i]);
  }
}

__global__ void F16ToF32Kernel(const __half* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = __half2float(src[i]);
  }
}

}  // namespace

cudaError_t Convert(Elem from, Elem to, const void* src, void* dst, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int blocks = FlatBlocks(n);
  if (from == Elem::kF32 && to == Elem::kBF16) {
    F32ToBf16Kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(src),
                                                static_cast<uint16_t*>(dst), n);
  } else if (from == Elem::kBF16 && to == Elem::kF32) {
    Bf16ToF32Kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint16_t*>(src),
                                                static_cast<float*>(dst), n);
  } else if (from == Elem::kF32 && to == Elem::kF16) {
    F32ToF16Kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(src),
                                               static_cast<__half*>(dst), n);
  } else if (from == Elem::kF16 && to == Elem::kF32) {
    F16ToF32Kernel<<<blocks, 256, 0, stream>>>(static_cast<const __half*>(src),
                                               static_cast<float*>(dst), n);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
