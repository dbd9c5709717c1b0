// The row kernels of causal attention: the scaled scores and their
// gradients come from cuBLAS (attention.cc); these apply the causal mask
// (and packed documents' starts), the softmax and the dropout at global
// indices (see core/cpu/attention.h).

#include <cmath>

#include "core/cuda/device_util.cuh"
#include "core/cuda/philox_device.h"

namespace loom::core::cuda::kernels {
namespace {

// Global dropout index of element (row i, column 0) of pair `pair` of probs.
__device__ __forceinline__ uint64_t RowBase(const AttentionMask& m, int64_t pair, int64_t s,
                                            int64_t i) {
  const int64_t bi = pair / m.heads, h = pair - bi * m.heads;
  const int64_t gpair = bi * m.total_heads + m.head_offset + h;
  return (static_cast<uint64_t>(gpair) * s + i) * static_cast<uint64_t>(s);
}

// The first live column of row i of pair `pair`: its document's start, or 0.
__device__ __forceinline__ int64_t RowStart(const AttentionMask& m, int64_t pair, int64_t s,
                                            int64_t i) {
  return m.doc_start == nullptr ? 0 : m.doc_start[pair / m.heads * s + i];
}

// One block per row R = pair * s + i; the row's live columns are lo..i.
template <typename T>
__global__ void CausalSoftmaxForwardKernel(T* scores, T* dropped, int64_t s, AttentionMask m) {
  __shared__ float smem[32];
  const int64_t R = blockIdx.x;
  const int64_t pair = R / s, i = R - pair * s;
  const int64_t lo = RowStart(m, pair, s, i);
  T* row = scores + R * s;
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, Load(row, j));
  mx = BlockReduce(mx, MaxOp(), smem);
  float sum = 0.0f;
  for (int64_t j = lo + threadIdx.x; j <= i; j += blockDim.x) sum += expf(Load(row, j) - mx);
  const float inv = 1.0f / BlockReduce(sum, SumOp(), smem);
  const uint64_t base = m.dropout ? RowBase(m, pair, s, i) : 0;
  T* drow = m.dropout ? dropped + R * s : nullptr;
  // Each thread reads row[j] before overwriting it; no other thread touches j.
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    const bool live = lo <= j && j <= i;
    const float p = live ? expf(Load(row, j) - mx) * inv : 0.0f;
    row[j] = FromFloat<T>(p);
    if (m.dropout) {
      const bool keep =
          live && DropoutBitsAtHD(m.params.seed, m.params.offset, base + j) >= m.params.threshold;
      drow[j] = FromFloat<T>(keep ? p * m.params.scale : 0.0f);
    }
  }
}

// ds: dP in, dS out. Pass 1 applies the dropout mask to dP (in place) and
// writes the dropped P, and sums P * dP'; pass 2 forms dS. Both passes give
// thread t the same columns, so pass 2 reads what the same thread wrote.
template <typename T>
__global__ void CausalSoftmaxBackwardKernel(const T* probs, T* ds, T* dropped, int64_t s,
                                            float attn_scale, AttentionMask m) {
  __shared__ float smem[32];
  const int64_t R = blockIdx.x;
  const int64_t pair = R / s, i = R - pair * s;
  const T* prow = probs + R * s;
  T* drow = ds + R * s;
  T* pdrow = m.dropout ? dropped + R * s : nullptr;
  const uint64_t base = m.dropout ? RowBase(m, pair, s, i) : 0;
  const int64_t lo = RowStart(m, pair, s, i);
  float dot = 0.0f;
  // From lo's block-aligned column, so thread t keeps pass 2's columns.
  for (int64_t j = lo - lo % blockDim.x + threadIdx.x; j <= i; j += blockDim.x) {
    if (j < lo) continue;
    const float p = Load(prow, j);
    float dp = Load(drow, j);
    if (m.dropout) {
      const bool keep = DropoutBitsAtHD(m.params.seed, m.params.offset, base + j) >= m.params.threshold;
      // dot sums the value pass 2 reads back: the stored (dtype-rounded) one.
      drow[j] = FromFloat<T>(keep ? dp * m.params.scale : 0.0f);
      dp = Load(drow, j);
      pdrow[j] = FromFloat<T>(keep ? p * m.params.scale : 0.0f);
    }
    dot += p * dp;
  }
  dot = BlockReduce(dot, SumOp(), smem);
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    if (lo <= j && j <= i) {
      drow[j] = FromFloat<T>(attn_scale * Load(prow, j) * (Load(drow, j) - dot));
    } else {
      drow[j] = FromFloat<T>(0.0f);
      if (m.dropout) pdrow[j] = FromFloat<T>(0.0f);
    }
  }
}

}  // namespace

cudaError_t CausalSoftmaxForward(Elem t, void* scores, void* dropped, int64_t pairs, int64_t s,
                                 const AttentionMask& mask, cudaStream_t stream) {
  if (pairs * s == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      CausalSoftmaxForwardKernel<T><<<RowGrid(pairs * s), RowThreads(s), 0,
                                                      stream>>>(
                          static_cast<T*>(scores), static_cast<T*>(dropped), s, mask));
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxBackward(Elem t, const void* probs, void* ds, void* dropped, int64_t pairs,
                                  int64_t s, float attn_scale, const AttentionMask& mask,
                                  cudaStream_t stream) {
  if (pairs * s == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      CausalSoftmaxBackwardKernel<T><<<RowGrid(pairs * s), RowThreads(s), 0,
                                                       stream>>>(
                          static_cast<const T*>(probs), static_cast<T*>(ds),
                          static_cast<T*>(dropped), s, attn_scale, mask));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
