// Embedding lookup and its scatter-add backward (f32 atomics).

#include <cmath>

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <typename T>
__global__ void EmbeddingForwardKernel(Index it, const void* ids, const T* table, int64_t n,
                                       int64_t v, int64_t c, int64_t vocab_start,
                                       bool zero_out_of_range, T* out) {
  const int64_t total = n * c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / c, j = i - r * c;
    const int64_t row = LoadIndex(ids, it, r) - vocab_start;
    if (row >= 0 && row < v) {
      out[i] = table[row * c + j];
    } else {
      out[i] = FromFloat<T>(zero_out_of_range ? 0.0f : NAN);
    }
  }
}

// Duplicate ids meet in atomicAdd: the sum is exact up to f32 reassociation
// (the order of additions varies from run to run).
template <typename T>
__global__ void EmbeddingBackwardKernel(Index it, const void* ids, const T* dout, int64_t n,
                                        int64_t v, int64_t c, int64_t vocab_start, float* dtable) {
  const int64_t total = n * c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / c, j = i - r * c;
    const int64_t row = LoadIndex(ids, it, r) - vocab_start;
    if (row >= 0 && row < v) atomicAdd(dtable + row * c + j, Load(dout, i));
  }
}

}  // namespace

cudaError_t EmbeddingForward(Elem t, Index it, const void* ids, const void* table, int64_t n,
                             int64_t v, int64_t c, int64_t vocab_start, bool zero_out_of_range,
                             void* out, cudaStream_t stream) {
  if (n * c == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      EmbeddingForwardKernel<T><<<FlatBlocks(n * c), 256, 0, stream>>>(
                          it, ids, static_cast<const T*>(table), n, v, c, vocab_start,
                          zero_out_of_range, static_cast<T*>(out)));
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(Elem t, Index it, const void* ids, const void* dout, int64_t n,
                              int64_t v, int64_t c, int64_t vocab_start, float* dtable,
                              cudaStream_t stream) {
  if (n * c == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      EmbeddingBackwardKernel<T><<<FlatBlocks(n * c), 256, 0, stream>>>(
                          it, ids, static_cast<const T*>(dout), n, v, c, vocab_start, dtable));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
