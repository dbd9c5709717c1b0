// Vocab-parallel cross-entropy passes: one block per row of local logits.

#include <cmath>

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <typename T>
__global__ void VocabRowMaxKernel(const T* logits, int64_t vp, int64_t valid, float* max) {
  __shared__ float smem[32];
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * vp;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, Load(x, j));
  m = BlockReduce(m, MaxOp(), smem);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <typename T>
__global__ void VocabSumExpKernel(const T* logits, Index it, const void* targets, int64_t vp,
                                  int64_t valid, int64_t vocab_start, const float* max,
                                  int64_t rows, float* sums) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vp;
  const float m = max[row];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) s += expf(Load(x, j) - m);
  s = BlockReduce(s, SumOp(), smem);
  if (threadIdx.x != 0) return;
  const int64_t t = LoadIndex(targets, it, row) - vocab_start;
  sums[row] = s;
  sums[rows + row] = (t >= 0 && t < valid) ? Load(x, t) - m : 0.0f;
}

// Each thread reads x[j] before writing d[j] (same j): dlogits may alias logits.
template <typename T>
__global__ void VocabCrossEntropyBackwardKernel(const T* logits, Index it, const void* targets,
                                                int64_t vp, int64_t valid, int64_t vocab_start,
                                                const float* max, const float* sum, float scale,
                                                T* dlogits) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vp;
  T* d = dlogits + row * vp;
  const float m = max[row], inv = 1.0f / sum[row];
  const int64_t t = LoadIndex(targets, it, row) - vocab_start;
  for (int64_t j = threadIdx.x; j < vp; j += blockDim.x) {
    float g = 0.0f;  // padding columns
    if (j < valid) g = (expf(Load(x, j) - m) * inv - (j == t ? 1.0f : 0.0f)) * scale;
    d[j] = FromFloat<T>(g);
  }
}

}  // namespace

cudaError_t VocabRowMax(Elem t, const void* logits, int64_t rows, int64_t vp, int64_t valid,
                        float* max, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      VocabRowMaxKernel<T><<<RowGrid(rows), RowThreads(vp), 0, stream>>>(
                          static_cast<const T*>(logits), vp, valid, max));
  return cudaGetLastError();
}

cudaError_t VocabSumExp(Elem t, const void* logits, Index it, const void* targets, int64_t rows,
                        int64_t vp, int64_t valid, int64_t vocab_start, const float* max,
                        float* sums, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      VocabSumExpKernel<T><<<RowGrid(rows), RowThreads(vp), 0, stream>>>(
                          static_cast<const T*>(logits), it, targets, vp, valid, vocab_start, max,
                          rows, sums));
  return cudaGetLastError();
}

cudaError_t VocabCrossEntropyBackward(Elem t, const void* logits, Index it, const void* targets,
                                      int64_t rows, int64_t vp, int64_t valid,
                                      int64_t vocab_start, const float* max, const float* sum,
                                      float scale, void* dlogits, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(
      t, T,
      VocabCrossEntropyBackwardKernel<T><<<RowGrid(rows), RowThreads(vp), 0, stream>>>(
          static_cast<const T*>(logits), it, targets, vp, valid, vocab_start, max, sum, scale,
          static_cast<T*>(dlogits)));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
