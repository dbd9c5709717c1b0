// Fused softmax cross-entropy: one block per row of logits.

#include <cmath>

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <typename T>
__global__ void CrossEntropyForwardKernel(const T* logits, Index it, const void* targets,
                                          int64_t v, int64_t ignore_index, float* losses,
                                          float* lse, unsigned long long* count,
                                          unsigned long long* bad_row) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * v;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, Load(x, j));
  mx = BlockReduce(mx, MaxOp(), smem);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(Load(x, j) - mx);
  sum = BlockReduce(sum, SumOp(), smem);
  if (threadIdx.x != 0) return;
  const float l = mx + logf(sum);
  const int64_t t = LoadIndex(targets, it, row);
  float loss = 0.0f;
  if (t != ignore_index) {
    if (t < 0 || t >= v) {
      atomicMin(bad_row, static_cast<unsigned long long>(row));
      loss = NAN;
    } else {
      loss = l - Load(x, t);
    }
    atomicAdd(count, 1ull);
  }
  losses[row] = loss;
  lse[row] = l;
}

__global__ void CountNotIgnoredKernel(Index it, const void* targets, int64_t rows,
                                      int64_t ignore_index, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows;
       i += int64_t{gridDim.x} * blockDim.x) {
    local += LoadIndex(targets, it, i) != ignore_index ? 1 : 0;
  }
  if (local != 0) atomicAdd(count, local);
}

// drow[j] = (exp(x[j] - lse) - [j == t]) * dloss / count. Each thread reads
// x[j] before writing drow[j] (same j): dlogits may alias logits.
template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* logits, Index it, const void* targets,
                                           const float* lse, int64_t v, int64_t ignore_index,
                                           float dloss, const unsigned long long* count,
                                           T* dlogits) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * v;
  T* d = dlogits + row * v;
  const int64_t t = LoadIndex(targets, it, row);
  const unsigned long long n = *count;
  const float g = n == 0 ? 0.0f : dloss / static_cast<float>(n);
  if (t == ignore_index) {
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) d[j] = FromFloat<T>(0.0f);
    return;
  }
  if (t < 0 || t >= v) {  // rejected by the forward; make it visible, never silent
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) d[j] = FromFloat<T>(NAN);
    return;
  }
  const float l = lse[row];
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    const float e = expf(Load(x, j) - l);
    d[j] = FromFloat<T>((j == t ? e - 1.0f : e) * g);
  }
}

}  // namespace

cudaError_t CrossEntropyForward(Elem t, const void* logits, Index it, const void* targets,
                                int64_t rows, int64_t v, int64_t ignore_index, float* losses,
                                float* lse, unsigned long long* count, unsigned long long* bad_row,
                                cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      CrossEntropyForwardKernel<T><<<RowGrid(rows), RowThreads(v), 0, stream>>>(
                          static_cast<const T*>(logits), it, targets, v, ignore_index, losses, lse,
                          count, bad_row));
  return cudaGetLastError();
}

cudaError_t CountNotIgnored(Index it, const void* targets, int64_t rows, int64_t ignore_index,
                            unsigned long long* count, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  CountNotIgnoredKernel<<<FlatBlocks(rows), 256, 0, stream>>>(it, targets, rows, ignore_index,
                                                              count);
  return cudaGetLastError();
}

cudaError_t CrossEntropyBackward(Elem t, const void* logits, Index it, const void* targets,
                                 const float* lse, int64_t rows, int64_t v, int64_t ignore_index,
                                 float dloss, const unsigned long long* count, void* dlogits,
                                 cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      CrossEntropyBackwardKernel<T><<<RowGrid(rows), RowThreads(v), 0, stream>>>(
                          static_cast<const T*>(logits), it, targets, lse, v, ignore_index, dloss,
                          count, static_cast<T*>(dlogits)));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
