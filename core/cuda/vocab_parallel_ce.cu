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

// exp(x - m) for an element of a running sum whose max is m; a -inf element
// adds 0 even when m is -inf too (no NaN from -inf - -inf), NaN stays NaN.
__device__ __forceinline__ float ExpAgainst(float x, float m) {
  return x == -INFINITY ? 0.0f : expf(x - m);
}

template <typename T>
__global__ void VocabMaxSumExpKernel(const T* logits, Index it, const void* targets, int64_t vp,
                                     int64_t valid, int64_t vocab_start, int64_t rows, float* max,
                                     float* sums) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vp;
  // Online softmax: each thread keeps its elements' max and their sum of
  // exponentials against it, rescaling the sum when the max grows.
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    const float v = Load(x, j);
    if (v > m) {
      s = s * ExpAgainst(m, v) + 1.0f;
      m = v;
    } else {
      s += ExpAgainst(v, m);
    }
  }
  const float row_max = BlockReduce(m, MaxOp(), smem);
  s = BlockReduce(s * ExpAgainst(m, row_max), SumOp(), smem);
  if (threadIdx.x != 0) return;
  const int64_t t = LoadIndex(targets, it, row) - vocab_start;
  max[row] = row_max;
  sums[row] = s;
  sums[rows + row] = (t >= 0 && t < valid) ? Load(x, t) - row_max : 0.0f;
}

// One thread per row: the formula of core/cpu/vocab_parallel_ce.cc's RescaledSum.
template <typename T>
__global__ void VocabRescaleSumsKernel(const T* logits, Index it, const void* targets, int64_t vp,
                                       int64_t valid, int64_t vocab_start, int64_t rows,
                                       const float* local_max, const float* max, float* sums) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (row >= rows) return;
  const float lm = local_max[row], gm = max[row];
  if (lm != gm) {
    sums[row] = static_cast<float>(static_cast<double>(sums[row]) *
                                   exp(static_cast<double>(lm) - static_cast<double>(gm)));
  }
  const int64_t t = LoadIndex(targets, it, row) - vocab_start;
  sums[rows + row] = (t >= 0 && t < valid) ? Load(logits + row * vp, t) - gm : 0.0f;
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

cudaError_t VocabMaxSumExp(Elem t, const void* logits, Index it, const void* targets,
                           int64_t rows, int64_t vp, int64_t valid, int64_t vocab_start,
                           float* max, float* sums, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      VocabMaxSumExpKernel<T><<<RowGrid(rows), RowThreads(vp), 0, stream>>>(
                          static_cast<const T*>(logits), it, targets, vp, valid, vocab_start, rows,
                          max, sums));
  return cudaGetLastError();
}

cudaError_t VocabRescaleSums(Elem t, const void* logits, Index it, const void* targets,
                             int64_t rows, int64_t vp, int64_t valid, int64_t vocab_start,
                             const float* local_max, const float* max, float* sums,
                             cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((rows + threads - 1) / threads);
  LOOM_DISPATCH_FLOAT(t, T,
                      VocabRescaleSumsKernel<T><<<blocks, threads, 0, stream>>>(
                          static_cast<const T*>(logits), it, targets, vp, valid, vocab_start, rows,
                          local_max, max, sums));
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
