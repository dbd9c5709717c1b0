// Dropout with masks bit-identical to core/cpu/dropout.cc: every element
// draws DropoutBitsAtHD at its GLOBAL index (philox_device.h).

#include "core/cuda/device_util.cuh"
#include "core/cuda/philox_device.h"

namespace loom::core::cuda::kernels {
namespace {

// One Philox block serves 8 elements; here each thread recomputes it for its
// own element (simple, and cheap next to the memory traffic at these sizes).
template <typename T>
__global__ void DropoutKernel(const T* x, T* out, uint8_t* mask, int64_t n, int64_t c,
                              int64_t first, int64_t stride, DropoutParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / c, j = i - r * c;
    const uint64_t g = static_cast<uint64_t>(first + r * stride + j);
    const bool keep = DropoutBitsAtHD(p.seed, p.offset, g) >= p.threshold;
    // A select, not a multiply by 0: dropped elements are 0 even when x is Inf/NaN (as on the CPU).
    out[i] = FromFloat<T>(keep ? Load(x, i) * p.scale : 0.0f);
    if (mask != nullptr) mask[i] = keep ? 1 : 0;
  }
}

}  // namespace

cudaError_t Dropout(Elem t, const void* x, void* out, uint8_t* mask, int64_t rows, int64_t c,
                    int64_t first, int64_t stride, const DropoutParams& p, cudaStream_t stream) {
  const int64_t n = rows * c;
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      DropoutKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
                          static_cast<const T*>(x), static_cast<T*>(out), mask, n, c, first,
                          stride, p));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
