// The mixture-of-experts layer's per-token work (core/cpu/moe.h's contract).
// Every sum runs in a fixed order (no atomics): results are deterministic.

#include <cmath>

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

constexpr int kThreads = 256;

// Sum of v over the block (blockDim.x a multiple of 32) in a fixed order;
// every thread gets it. `smem` holds 32 doubles.
__device__ double BlockSumDouble(double v, double* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double r = smem[0];
  for (int w = 1; w < warps; ++w) r += smem[w];
  return r;
}

// Exclusive prefix sum of v over the block in thread order; *total gets the
// block's sum. `smem` holds 33 ints.
__device__ int BlockExclusiveScan(int v, int* smem, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) smem[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int w = 0; w < warps; ++w) {
      const int s = smem[w];
      smem[w] = acc;
      acc += s;
    }
    smem[32] = acc;
  }
  __syncthreads();
  *total = smem[32];
  return smem[warp] + x - v;
}

// One thread per token. The k-th choice is the best logit (ties: the lower
// index) among those after the (k-1)-th in that order: no per-thread arrays.
__global__ void RouteTopKKernel(const float* logits, int64_t T, int64_t E, int64_t K,
                                int32_t* expert, float* prob, double* scratch) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  const int64_t width = 2 * E + 1;
  double* sc = scratch + t * width;
  for (int64_t e = 0; e < E; ++e) sc[e] = 0.0;
  float pv = 0.0f;
  int64_t pe = -1;
  for (int64_t k = 0; k < K; ++k) {
    int64_t best = -1;
    float bv = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      const float v = l[e];
      if (pe >= 0 && !(v < pv || (v == pv && e > pe))) continue;
      if (best < 0 || v > bv) {
        best = e;
        bv = v;
      }
    }
    if (best < 0) best = 0;  // only NaN left: any expert, but a valid index
    expert[t * K + k] = static_cast<int32_t>(best);
    sc[best] += 1.0;
    pv = bv;
    pe = best;
  }
  // Softmax over the K chosen logits in double (the first is their max).
  const double cmax = l[expert[t * K]];
  double csum = 0;
  for (int64_t k = 0; k < K; ++k) csum += exp(double(l[expert[t * K + k]]) - cmax);
  for (int64_t k = 0; k < K; ++k) {
    prob[t * K + k] = static_cast<float>(exp(double(l[expert[t * K + k]]) - cmax) / csum);
  }
  double max = l[0];
  for (int64_t e = 1; e < E; ++e) max = fmax(max, double(l[e]));
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += exp(double(l[e]) - max);
  for (int64_t e = 0; e < E; ++e) sc[E + e] = exp(double(l[e]) - max) / sum;
  const double lse = max + log(sum);
  sc[2 * E] = lse * lse;
}

// stats[c] = Σ_t scratch[t, c]: one block per column.
__global__ void ColumnSumKernel(const double* scratch, int64_t T, int64_t width, double* stats) {
  __shared__ double smem[32];
  const int64_t c = blockIdx.x;
  double v = 0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) v += scratch[t * width + c];
  v = BlockSumDouble(v, smem);
  if (threadIdx.x == 0) stats[c] = v;
}

// counts[e] = slots routed to e: one block per expert.
__global__ void CountKernel(const int32_t* expert, int64_t slots, int32_t* counts) {
  __shared__ double smem[32];
  double n = 0;
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) n += expert[s] == blockIdx.x;
  n = BlockSumDouble(n, smem);
  if (threadIdx.x == 0) counts[blockIdx.x] = static_cast<int32_t>(n);
}

__device__ __forceinline__ int64_t RowsOf(int64_t n, int64_t cap, bool pad) {
  return cap > 0 ? (pad ? cap : (n < cap ? n : cap)) : n;
}

// One block per expert: its slots in slot order (list), which it keeps (the
// `cap` most probable, ties: the earlier slot), their rows, its padding.
__global__ void LayoutKernel(const int32_t* expert, const float* prob, int64_t T, int64_t E,
                             int64_t K, int64_t cap, bool pad, int32_t* scratch, int32_t* row,
                             int32_t* row_token, int64_t n_rows) {
  __shared__ int smem[33];
  const int64_t slots = T * K, e = blockIdx.x;
  const int32_t* counts = scratch + 2 * slots;
  int64_t slot_start = 0, row_start = 0;
  for (int64_t f = 0; f < e; ++f) {
    slot_start += counts[f];
    row_start += RowsOf(counts[f], cap, pad);
  }
  const int64_t n = counts[e];
  int32_t* list = scratch + slot_start;
  int32_t* keep = scratch + slots + slot_start;
  int run = 0, total = 0;
  for (int64_t base = 0; base < slots; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    const int flag = s < slots && expert[s] == e;
    const int pos = BlockExclusiveScan(flag, smem, &total);
    if (flag) list[run + pos] = static_cast<int32_t>(s);
    run += total;
  }
  __syncthreads();
  const bool dropping = cap > 0 && n > cap;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    int flag = 1;
    if (dropping) {
      const int32_t s = list[i];
      const float ps = prob[s];
      int64_t rank = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int32_t sj = list[j];
        const float pj = prob[sj];
        rank += pj > ps || (pj == ps && sj < s);
      }
      flag = rank < cap;
    }
    keep[i] = flag;
  }
  __syncthreads();
  run = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const int flag = i < n && keep[i];
    const int pos = BlockExclusiveScan(flag, smem, &total);
    if (flag) {
      const int64_t r = row_start + run + pos;
      row[list[i]] = static_cast<int32_t>(r);
      if (r < n_rows) row_token[r] = static_cast<int32_t>(list[i] / K);
    }
    run += total;
  }
  for (int64_t i = run + threadIdx.x; i < RowsOf(n, cap, pad); i += blockDim.x) {
    const int64_t r = row_start + i;
    if (r < n_rows) row_token[r] = -1;
  }
}

// One block per token; its kept rows sorted ascending in shared memory
// (K + 1 ints: the rows, then their count).
template <typename T>
__global__ void PermuteBackwardKernel(const T* drows, const int32_t* row, int64_t K, int64_t h,
                                      T* dx) {
  extern __shared__ int32_t sorted[];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = row[t * K + k];
      if (r < 0) continue;
      int i = n++;
      while (i > 0 && sorted[i - 1] > r) {
        sorted[i] = sorted[i - 1];
        --i;
      }
      sorted[i] = r;
    }
    sorted[K] = n;
  }
  __syncthreads();
  const int n = sorted[K];
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) acc += Load(drows, int64_t{sorted[i]} * h + j);
    dx[t * h + j] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void CombineForwardKernel(const T* rows, const float* prob, const int32_t* row,
                                     int64_t K, int64_t h, T* y) {
  const int64_t t = blockIdx.x;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = row[t * K + k];
      if (r >= 0) acc += prob[t * K + k] * Load(rows, int64_t{r} * h + j);
    }
    y[t * h + j] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void CombineBackwardKernel(const T* dy, const T* rows, const float* prob,
                                      const int32_t* row, int64_t K, int64_t h, T* drows,
                                      float* dprob) {
  __shared__ double smem[32];
  const int64_t t = blockIdx.x;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t r = row[t * K + k];  // uniform over the block
    if (r < 0) {
      if (threadIdx.x == 0) dprob[t * K + k] = 0.0f;
      continue;
    }
    const float p = prob[t * K + k];
    double dot = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const float g = Load(dy, t * h + j);
      drows[r * h + j] = FromFloat<T>(p * g);
      dot += double(g) * double(Load(rows, r * h + j));
    }
    dot = BlockSumDouble(dot, smem);
    if (threadIdx.x == 0) dprob[t * K + k] = static_cast<float>(dot);
  }
}

// One thread per token (E and K are small), in double as the CPU.
__global__ void RouterBackwardKernel(const float* logits, const int32_t* expert,
                                     const float* prob, const float* dprob,
                                     const double* aux_grad, bool z_loss, double z_scale,
                                     int64_t T, int64_t E, int64_t K, float* dlogits) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  float* d = dlogits + t * E;
  const float* l = logits + t * E;
  for (int64_t e = 0; e < E; ++e) d[e] = 0.0f;
  double dot = 0;
  for (int64_t k = 0; k < K; ++k) dot += double(prob[t * K + k]) * dprob[t * K + k];
  for (int64_t k = 0; k < K; ++k) {
    const double pk = prob[t * K + k];
    d[expert[t * K + k]] += static_cast<float>(pk * (double(dprob[t * K + k]) - dot));
  }
  if (!z_loss && aux_grad == nullptr) return;
  double max = l[0];
  for (int64_t e = 1; e < E; ++e) max = fmax(max, double(l[e]));
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += exp(double(l[e]) - max);
  const double lse = max + log(sum);
  double sg = 0;
  if (aux_grad != nullptr) {
    for (int64_t e = 0; e < E; ++e) sg += exp(double(l[e]) - max) / sum * aux_grad[e];
  }
  const double zg = z_loss ? z_scale * lse / double(T) : 0.0;
  for (int64_t e = 0; e < E; ++e) {
    const double s = exp(double(l[e]) - max) / sum;
    const double g = aux_grad != nullptr ? aux_grad[e] : 0.0;
    d[e] += static_cast<float>(s * (g - sg) + zg * s);
  }
}

int TokenBlocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t MoeRouteTopK(const float* logits, int64_t tokens, int64_t experts, int64_t topk,
                         int32_t* expert, float* prob, double* scratch, double* stats,
                         cudaStream_t stream) {
  const int64_t width = 2 * experts + 1;
  if (tokens == 0) return cudaMemsetAsync(stats, 0, width * sizeof(double), stream);
  RouteTopKKernel<<<TokenBlocks(tokens), kThreads, 0, stream>>>(logits, tokens, experts, topk,
                                                                 expert, prob, scratch);
  ColumnSumKernel<<<static_cast<unsigned>(width), kThreads, 0, stream>>>(scratch, tokens, width,
                                                                         stats);
  return cudaGetLastError();
}

cudaError_t MoeRouteLayout(const int32_t* expert, const float* prob, int64_t tokens,
                           int64_t experts, int64_t topk, int64_t capacity, bool pad,
                           int32_t* scratch, int32_t* row, int32_t* row_token, int64_t n_rows,
                           cudaStream_t stream) {
  const int64_t slots = tokens * topk;
  if (slots > 0) {
    cudaError_t err = cudaMemsetAsync(row, 0xff, slots * sizeof(int32_t), stream);  // -1
    if (err != cudaSuccess) return err;
  }
  const unsigned grid = static_cast<unsigned>(experts);
  CountKernel<<<grid, kThreads, 0, stream>>>(expert, slots, scratch + 2 * slots);
  LayoutKernel<<<grid, kThreads, 0, stream>>>(expert, prob, tokens, experts, topk, capacity, pad,
                                              scratch, row, row_token, n_rows);
  return cudaGetLastError();
}

cudaError_t MoePermuteBackward(Elem t, const void* drows, const int32_t* row, int64_t tokens,
                               int64_t topk, int64_t h, void* dx, cudaStream_t stream) {
  if (tokens * h == 0) return cudaSuccess;
  const size_t smem = (topk + 1) * sizeof(int32_t);
  LOOM_DISPATCH_FLOAT(t, T,
                      PermuteBackwardKernel<T><<<RowGrid(tokens), RowThreads(h), smem, stream>>>(
                          static_cast<const T*>(drows), row, topk, h, static_cast<T*>(dx)));
  return cudaGetLastError();
}

cudaError_t MoeCombineForward(Elem t, const void* rows, const float* prob, const int32_t* row,
                              int64_t tokens, int64_t topk, int64_t h, void* y,
                              cudaStream_t stream) {
  if (tokens * h == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      CombineForwardKernel<T><<<RowGrid(tokens), RowThreads(h), 0, stream>>>(
                          static_cast<const T*>(rows), prob, row, topk, h, static_cast<T*>(y)));
  return cudaGetLastError();
}

cudaError_t MoeCombineBackward(Elem t, const void* dy, const void* rows, const float* prob,
                               const int32_t* row, int64_t tokens, int64_t topk, int64_t h,
                               int64_t n_rows, void* drows, float* dprob, cudaStream_t stream) {
  const size_t elem = t == Elem::kF32 ? 4 : 2;
  if (n_rows * h > 0) {  // rows no assignment owns (padding) get zeros
    cudaError_t err = cudaMemsetAsync(drows, 0, n_rows * h * elem, stream);
    if (err != cudaSuccess) return err;
  }
  if (tokens * topk == 0) return cudaSuccess;
  if (h == 0) return cudaMemsetAsync(dprob, 0, tokens * topk * sizeof(float), stream);
  LOOM_DISPATCH_FLOAT(t, T,
                      CombineBackwardKernel<T><<<RowGrid(tokens), RowThreads(h), 0, stream>>>(
                          static_cast<const T*>(dy), static_cast<const T*>(rows), prob, row,
                          topk, h, static_cast<T*>(drows), dprob));
  return cudaGetLastError();
}

cudaError_t MoeRouterBackward(const float* logits, const int32_t* expert, const float* prob,
                              const float* dprob, const double* aux_grad, bool z_loss,
                              double z_scale, int64_t tokens, int64_t experts, int64_t topk,
                              float* dlogits, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  RouterBackwardKernel<<<TokenBlocks(tokens), kThreads, 0, stream>>>(
      logits, expert, prob, dprob, aux_grad, z_loss, z_scale, tokens, experts, topk, dlogits);
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
