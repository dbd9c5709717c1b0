// Flash attention on the GPU: core/cpu/flash_attention.h's algorithm (tiles
// of keys with an online softmax; no s x s matrix), the same causal mask,
// 1/sqrt(d) scale and dropout mask at the GLOBAL probabilities index
// ((b_i * total_heads + head_offset + h) * s + i) * s + j.
//
// Packed documents (AttentionMask::doc_start, device [b, seq_len] at global
// positions): query i also needs key j >= doc_start[i]; a query tile starts
// at the key tile holding its earliest document start (the tiles before it
// are never loaded), and a key tile skips the query tiles whose documents all
// start after its last key, as the CPU kernel does.
//
// One thread block per (query or key tile, pair); R = FlashRows(d) threads,
// one row each; the other operand's tile sits in shared memory, read by all
// threads at once (broadcast). Math in f32; qkv, out, dout, dqkv of type T.
//   forward:   block (query tile, pair): m, l, acc over key tiles; writes out, lse.
//   backward:  delta = rowsum(dO * O); block (query tile, pair) accumulates dQ
//              over key tiles; block (key tile, pair) accumulates dK, dV over
//              query tiles. No atomics: deterministic.
//
// The kernels see a block of Q rows against a block of K/V rows at global
// positions (FlashGeom): the whole-sequence attention is the block of every
// row against every row from position 0; the context-parallel ring's blocks
// (core/cpu/flash_block.h) read Q from qkv and K/V from the packed buffer
// that travels the ring, at the chunks' positions, and keep the running
// state (acc, m, l) and the gradients in f32 between blocks.

#include <climits>
#include <cmath>

#include "core/cuda/device_util.cuh"
#include "core/cuda/philox_device.h"

namespace loom::core::cuda::kernels {
namespace {

struct FlashGeom {
  int64_t b, heads, d;
  // Q rows [0, q_len): row i of pair p at q + i * ld_q + p * pq (dQ alike).
  int64_t q_len, ld_q, pq;
  // K/V rows [0, k_len): row j of pair p at k (v) + j * ld_kv + p * pkv (dK, dV alike).
  int64_t k_len, ld_kv, pkv;
  int64_t ld_out;   // out / dout rows: i * ld_out + p * d
  int64_t st_rows;  // pair stride of the per-row f32 vectors (lse, delta, m, l; acc: x d)
  int64_t q_start, k_start;  // global positions of Q row 0 and K row 0
  int64_t seq_len;           // the dropout index's row length
  bool causal;               // query i sees key j iff k_start + j <= q_start + i
  float scale;               // 1 / sqrt(d)
};

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

// keep / (1 - p) or 0 for element (global i, global j) of pair; 1 without dropout.
__device__ __forceinline__ float KeepFactor(const AttentionMask& m, const FlashGeom& g,
                                            int64_t pair, int64_t i, int64_t j) {
  if (!m.dropout) return 1.0f;
  const int64_t bi = pair / m.heads, h = pair - bi * m.heads;
  const uint64_t gpair = static_cast<uint64_t>(bi * m.total_heads + m.head_offset + h);
  const uint64_t index = (gpair * g.seq_len + i) * static_cast<uint64_t>(g.seq_len) + j;
  return DropoutBitsAtHD(m.params.seed, m.params.offset, index) >= m.params.threshold
             ? m.params.scale
             : 0.0f;
}

// Keys [0, end) a query tile [q0, q0 + R) can see.
__device__ __forceinline__ int64_t KeyEnd(const FlashGeom& g, int64_t q0, int R) {
  if (!g.causal) return g.k_len;
  return Min64(g.k_len, g.q_start + Min64(q0 + R, g.q_len) - g.k_start);
}

// Live keys of the tile from local key k0 for (global) query gi.
__device__ __forceinline__ int LiveKeys(const FlashGeom& g, int64_t gi, int64_t k0, int R) {
  int64_t n = Min64(R, g.k_len - k0);
  if (g.causal) n = Min64(n, gi - (g.k_start + k0) + 1);
  return static_cast<int>(Max64(n, -1));
}

// This batch row's document starts (global positions), or null.
__device__ __forceinline__ const int32_t* RowDocStarts(const AttentionMask& m, const FlashGeom& g,
                                                       int64_t pair) {
  return m.doc_start == nullptr ? nullptr : m.doc_start + pair / m.heads * g.seq_len;
}

// The first local key (a multiple of R) a query tile [q0, q0 + R) needs:
// the tile holding its rows' earliest document start (0 without documents).
// Every thread of the block calls it (it synchronises).
template <int R>
__device__ __forceinline__ int64_t FirstKeyTile(const int32_t* docs, const FlashGeom& g,
                                                int64_t q0) {
  if (docs == nullptr) return 0;
  __shared__ int first;
  if (threadIdx.x == 0) first = INT_MAX;
  __syncthreads();
  const int64_t i = q0 + threadIdx.x;
  if (i < g.q_len) atomicMin(&first, docs[g.q_start + i]);
  __syncthreads();
  const int64_t k = first - g.k_start;
  return k <= 0 ? 0 : k / R * R;
}

// The first live key of the tile from local key k0 for a query whose
// document starts at global position lo (0 without documents).
__device__ __forceinline__ int FirstLiveKey(const FlashGeom& g, int64_t lo, int64_t k0) {
  return static_cast<int>(Max64(0, lo - (g.k_start + k0)));
}

// Loads rows [r0, r0 + R) (zeros past s) of one d-wide operand into sh
// (row stride ld_sh), all threads cooperating.
template <typename T, int R>
__device__ __forceinline__ void LoadTile(const T* base, int64_t ld, int64_t r0, int64_t s,
                                         int64_t d, float* sh, int64_t ld_sh) {
  for (int64_t idx = threadIdx.x; idx < R * d; idx += R) {
    const int64_t r = idx / d, e = idx - r * d;
    sh[r * ld_sh + e] = r0 + r < s ? Load(base, (r0 + r) * ld + e) : 0.0f;
  }
}

// kBlock: the running state (acc [pair, st_rows, d], m, l [pair, st_rows],
// f32) is read first and written back instead of out and lse.
template <typename T, int R, bool kBlock>
__global__ void __launch_bounds__(R) FlashForwardKernel(const T* qp, const T* kp, const T* vp,
                                                        T* out, float* lse, float* st_acc,
                                                        float* st_m, float* st_l, FlashGeom g,
                                                        AttentionMask m) {
  extern __shared__ float smem[];
  const int64_t d = g.d, dp = d + 1;  // padded private rows (no bank conflicts)
  float* qs = smem;          // [R, d + 1]
  float* acc = qs + R * dp;  // [R, d + 1]
  float* ks = acc + R * dp;  // [R, d]
  float* vs = ks + R * d;    // [R, d]
  const int64_t pair = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * R;
  const int tid = threadIdx.x;
  const int64_t i = q0 + tid, gi = g.q_start + i;
  const T* k = kp + pair * g.pkv;
  const T* v = vp + pair * g.pkv;
  LoadTile<T, R>(qp + pair * g.pq, g.ld_q, q0, g.q_len, d, qs, dp);
  const int32_t* docs = RowDocStarts(m, g, pair);
  const int64_t lo = docs != nullptr && i < g.q_len ? docs[gi] : 0;
  float mx = -INFINITY, l = 0.0f;
  const int64_t st = pair * g.st_rows + i;
  if (kBlock && i < g.q_len) {
    for (int64_t e = 0; e < d; ++e) acc[tid * dp + e] = st_acc[st * d + e];
    mx = st_m[st];
    l = st_l[st];
  } else {
    for (int64_t e = 0; e < d; ++e) acc[tid * dp + e] = 0.0f;
  }
  const int64_t k_end = KeyEnd(g, q0, R);
  for (int64_t k0 = FirstKeyTile<R>(docs, g, q0); k0 < k_end; k0 += R) {
    __syncthreads();
    LoadTile<T, R>(k, g.ld_kv, k0, g.k_len, d, ks, d);
    LoadTile<T, R>(v, g.ld_kv, k0, g.k_len, d, vs, d);
    __syncthreads();
    if (i >= g.q_len) continue;
    const int n = LiveKeys(g, gi, k0, R);
    const int j0 = FirstLiveKey(g, lo, k0);
    if (n <= j0) continue;
    float sc[R];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (j0 <= j && j < n) {
        float dot = 0.0f;
        for (int64_t e = 0; e < d; ++e) dot += qs[tid * dp + e] * ks[j * d + e];
        sc[j] = dot * g.scale;
        tile_max = fmaxf(tile_max, sc[j]);
      }
    }
    const float m_new = fmaxf(mx, tile_max);
    const float alpha = mx == -INFINITY ? 0.0f : expf(mx - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (j0 <= j && j < n) {
        const float p = expf(sc[j] - m_new);
        sum += p;
        sc[j] = p * KeepFactor(m, g, pair, gi, g.k_start + k0 + j);
      }
    }
    l = l * alpha + sum;
    mx = m_new;
    for (int64_t e = 0; e < d; ++e) {
      float a = acc[tid * dp + e] * alpha;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (j0 <= j && j < n) a += sc[j] * vs[j * d + e];
      }
      acc[tid * dp + e] = a;
    }
  }
  if (i >= g.q_len) return;
  if (kBlock) {
    for (int64_t e = 0; e < d; ++e) st_acc[st * d + e] = acc[tid * dp + e];
    st_m[st] = mx;
    st_l[st] = l;
    return;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* o = out + i * g.ld_out + pair * d;
  for (int64_t e = 0; e < d; ++e) o[e] = FromFloat<T>(acc[tid * dp + e] * inv);
  lse[st] = l > 0.0f ? mx + logf(l) : -INFINITY;
}

// delta[pair, i] = sum_e dout[i, e] out[i, e] for the q_len rows; one thread
// per (pair, i).
template <typename T>
__global__ void FlashDeltaKernel(const T* dout, const T* out, float* delta, FlashGeom g) {
  const int64_t n = g.b * g.heads * g.q_len;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = t / g.q_len, i = t - pair * g.q_len;
    const int64_t row = i * g.ld_out + pair * g.d;
    float acc = 0.0f;
    for (int64_t e = 0; e < g.d; ++e) acc += Load(dout, row + e) * Load(out, row + e);
    delta[pair * g.st_rows + i] = acc;
  }
}

// dQ of one query tile: thread = query row i, K/V tiles in shared memory.
// Written as G (the activations' type), or added to G = f32 accumulators.
template <typename T, typename G, int R>
__global__ void __launch_bounds__(R) FlashBackwardDqKernel(const T* dout, const T* qp,
                                                           const T* kp, const T* vp,
                                                           const float* lse, const float* delta,
                                                           G* dqp, bool accumulate, FlashGeom g,
                                                           AttentionMask m) {
  extern __shared__ float smem[];
  const int64_t d = g.d, dp = d + 1;
  float* qs = smem;          // [R, d + 1]
  float* dos = qs + R * dp;  // [R, d + 1]
  float* dqs = dos + R * dp; // [R, d + 1]
  float* ks = dqs + R * dp;  // [R, d]
  float* vs = ks + R * d;    // [R, d]
  const int64_t pair = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * R;
  const int tid = threadIdx.x;
  const int64_t i = q0 + tid, gi = g.q_start + i;
  const T* k = kp + pair * g.pkv;
  const T* v = vp + pair * g.pkv;
  LoadTile<T, R>(qp + pair * g.pq, g.ld_q, q0, g.q_len, d, qs, dp);
  LoadTile<T, R>(dout + pair * d, g.ld_out, q0, g.q_len, d, dos, dp);
  for (int64_t e = 0; e < d; ++e) dqs[tid * dp + e] = 0.0f;
  const float row_lse = i < g.q_len ? lse[pair * g.st_rows + i] : -INFINITY;
  const float row_delta = i < g.q_len ? delta[pair * g.st_rows + i] : 0.0f;
  const int32_t* docs = RowDocStarts(m, g, pair);
  const int64_t lo = docs != nullptr && i < g.q_len ? docs[gi] : 0;
  const int64_t k_end = KeyEnd(g, q0, R);
  for (int64_t k0 = FirstKeyTile<R>(docs, g, q0); k0 < k_end; k0 += R) {
    __syncthreads();
    LoadTile<T, R>(k, g.ld_kv, k0, g.k_len, d, ks, d);
    LoadTile<T, R>(v, g.ld_kv, k0, g.k_len, d, vs, d);
    __syncthreads();
    if (i >= g.q_len || row_lse == -INFINITY) continue;
    const int n = LiveKeys(g, gi, k0, R);
    for (int j = FirstLiveKey(g, lo, k0); j < n; ++j) {
      float qk = 0.0f, dpv = 0.0f;
      for (int64_t e = 0; e < d; ++e) {
        qk += qs[tid * dp + e] * ks[j * d + e];
        dpv += dos[tid * dp + e] * vs[j * d + e];
      }
      const float p = expf(qk * g.scale - row_lse);
      const float ds =
          p * (dpv * KeepFactor(m, g, pair, gi, g.k_start + k0 + j) - row_delta) * g.scale;
      for (int64_t e = 0; e < d; ++e) dqs[tid * dp + e] += ds * ks[j * d + e];
    }
  }
  if (i >= g.q_len) return;
  G* dq = dqp + i * g.ld_q + pair * g.pq;
  for (int64_t e = 0; e < d; ++e) {
    dq[e] = FromFloat<G>(accumulate ? Load(dq, e) + dqs[tid * dp + e] : dqs[tid * dp + e]);
  }
}

// dK, dV of one key tile: thread = key row j, query tiles in shared memory.
// Written or accumulated as dQ.
template <typename T, typename G, int R>
__global__ void __launch_bounds__(R) FlashBackwardDkvKernel(const T* dout, const T* qp,
                                                            const T* kp, const T* vp,
                                                            const float* lse, const float* delta,
                                                            G* dkp, G* dvp, bool accumulate,
                                                            FlashGeom g, AttentionMask m) {
  extern __shared__ float smem[];
  const int64_t d = g.d, dp = d + 1;
  float* ks = smem;           // [R, d + 1]
  float* vs = ks + R * dp;    // [R, d + 1]
  float* dks = vs + R * dp;   // [R, d + 1]
  float* dvs = dks + R * dp;  // [R, d + 1]
  float* qs = dvs + R * dp;   // [R, d]
  float* dos = qs + R * d;    // [R, d]
  float* lse_s = dos + R * d; // [R]
  float* delta_s = lse_s + R; // [R]
  int* doc_s = reinterpret_cast<int*>(delta_s + R);  // [R] (packed documents)
  const int64_t pair = blockIdx.y, k0 = static_cast<int64_t>(blockIdx.x) * R;
  const int tid = threadIdx.x;
  const int64_t j = k0 + tid, gj = g.k_start + j;
  const T* q = qp + pair * g.pq;
  LoadTile<T, R>(kp + pair * g.pkv, g.ld_kv, k0, g.k_len, d, ks, dp);
  LoadTile<T, R>(vp + pair * g.pkv, g.ld_kv, k0, g.k_len, d, vs, dp);
  for (int64_t e = 0; e < d; ++e) dks[tid * dp + e] = dvs[tid * dp + e] = 0.0f;
  // Causal: queries from the tile's first key's position.
  const int64_t q_begin = g.causal ? Max64(0, g.k_start + k0 - g.q_start) : 0;
  const int32_t* docs = RowDocStarts(m, g, pair);
  const int64_t k_last = g.k_start + Min64(k0 + R, g.k_len) - 1;  // global
  for (int64_t q0 = q_begin; q0 < g.q_len; q0 += R) {
    __syncthreads();
    if (docs != nullptr) {
      // Skip the query tile when every one of its documents starts after
      // this tile's last key (the same decision in every thread).
      doc_s[tid] = q0 + tid < g.q_len ? docs[g.q_start + q0 + tid] : INT_MAX;
      __syncthreads();
      int first = INT_MAX;
      for (int r = 0; r < R; ++r) first = min(first, doc_s[r]);
      if (first > k_last) continue;
    }
    LoadTile<T, R>(q, g.ld_q, q0, g.q_len, d, qs, d);
    LoadTile<T, R>(dout + pair * d, g.ld_out, q0, g.q_len, d, dos, d);
    lse_s[tid] = q0 + tid < g.q_len ? lse[pair * g.st_rows + q0 + tid] : -INFINITY;
    delta_s[tid] = q0 + tid < g.q_len ? delta[pair * g.st_rows + q0 + tid] : 0.0f;
    __syncthreads();
    if (j >= g.k_len) continue;
    for (int r = 0; r < R; ++r) {
      const int64_t i = q0 + r, gi = g.q_start + i;
      if (i >= g.q_len) break;
      if ((g.causal && gi < gj) || lse_s[r] == -INFINITY) continue;
      if (docs != nullptr && doc_s[r] > gj) continue;  // another document's key
      float qk = 0.0f, dpv = 0.0f;
      for (int64_t e = 0; e < d; ++e) {
        qk += qs[r * d + e] * ks[tid * dp + e];
        dpv += dos[r * d + e] * vs[tid * dp + e];
      }
      const float p = expf(qk * g.scale - lse_s[r]);
      const float keep = KeepFactor(m, g, pair, gi, gj);
      const float pd = p * keep;
      const float ds = p * (dpv * keep - delta_s[r]) * g.scale;
      for (int64_t e = 0; e < d; ++e) {
        dvs[tid * dp + e] += pd * dos[r * d + e];
        dks[tid * dp + e] += ds * qs[r * d + e];
      }
    }
  }
  if (j >= g.k_len) return;
  G* dk = dkp + j * g.ld_kv + pair * g.pkv;
  G* dv = dvp + j * g.ld_kv + pair * g.pkv;
  for (int64_t e = 0; e < d; ++e) {
    dk[e] = FromFloat<G>(accumulate ? Load(dk, e) + dks[tid * dp + e] : dks[tid * dp + e]);
    dv[e] = FromFloat<G>(accumulate ? Load(dv, e) + dvs[tid * dp + e] : dvs[tid * dp + e]);
  }
}

// The whole sequence: every row of qkv against every row, from position 0.
FlashGeom Geom(int64_t s, int64_t b, int64_t d, const AttentionMask& mask) {
  FlashGeom g;
  g.b = b;
  g.heads = mask.heads;
  g.d = d;
  g.q_len = g.k_len = s;
  g.ld_q = g.ld_kv = b * mask.heads * 3 * d;
  g.pq = g.pkv = 3 * d;
  g.ld_out = b * mask.heads * d;
  g.st_rows = s;
  g.q_start = g.k_start = 0;
  g.seq_len = s;
  g.causal = true;
  g.scale = 1.0f / sqrtf(static_cast<float>(d));
  return g;
}

// A ring block: Q rows of qkv, K/V rows of the packed buffer [rows, b, heads, 2, d].
FlashGeom BlockGeom(const FlashBlockArgs& a, const AttentionMask& mask) {
  FlashGeom g;
  g.b = a.b;
  g.heads = mask.heads;
  g.d = a.d;
  g.q_len = a.q_len;
  g.ld_q = a.b * mask.heads * 3 * a.d;
  g.pq = 3 * a.d;
  g.k_len = a.k_len;
  g.ld_kv = a.b * mask.heads * 2 * a.d;
  g.pkv = 2 * a.d;
  g.ld_out = a.b * mask.heads * a.d;
  g.st_rows = a.st_rows;
  g.q_start = a.q_start;
  g.k_start = a.k_start;
  g.seq_len = a.seq_len;
  g.causal = a.causal;
  g.scale = 1.0f / sqrtf(static_cast<float>(a.d));
  return g;
}

// Launches kernel on (tiles of R rows over `rows`, pairs) with `floats` of
// dynamic shared memory.
template <typename Kernel, typename... Args>
cudaError_t LaunchTiles(Kernel kernel, int R, int64_t rows, int64_t pairs, size_t floats,
                        cudaStream_t stream, Args... args) {
  const size_t bytes = floats * sizeof(float);
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((rows + R - 1) / R), static_cast<unsigned>(pairs));
  kernel<<<grid, R, bytes, stream>>>(args...);
  return cudaGetLastError();
}

size_t ForwardFloats(int R, int64_t d) { return 2 * R * (d + 1) + 2 * R * d; }
size_t DqFloats(int R, int64_t d) { return 3 * R * (d + 1) + 2 * R * d; }
size_t DkvFloats(int R, int64_t d) { return 4 * R * (d + 1) + 2 * R * d + 3 * R; }

template <typename T, int R>
cudaError_t ForwardT(const void* qkv, void* out, float* lse, const FlashGeom& g,
                     const AttentionMask& mask, cudaStream_t stream) {
  const T* q = static_cast<const T*>(qkv);
  return LaunchTiles(FlashForwardKernel<T, R, false>, R, g.q_len, g.b * g.heads,
                     ForwardFloats(R, g.d), stream, q, q + g.d, q + 2 * g.d, static_cast<T*>(out),
                     lse, static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                     static_cast<float*>(nullptr), g, mask);
}

template <typename T>
cudaError_t DeltaT(const void* dout, const void* out, float* delta, const FlashGeom& g,
                   cudaStream_t stream) {
  FlashDeltaKernel<T><<<FlatBlocks(g.b * g.heads * g.q_len), 256, 0, stream>>>(
      static_cast<const T*>(dout), static_cast<const T*>(out), delta, g);
  return cudaGetLastError();
}

// dQ, then dK and dV, of type G (accumulated when `accumulate`).
template <typename T, typename G, int R>
cudaError_t GradsT(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                   const float* delta, G* dq, G* dk, G* dv, bool accumulate, const FlashGeom& g,
                   const AttentionMask& mask, cudaStream_t stream) {
  const int64_t pairs = g.b * g.heads;
  cudaError_t err = LaunchTiles(FlashBackwardDqKernel<T, G, R>, R, g.q_len, pairs,
                                DqFloats(R, g.d), stream, dout, q, k, v, lse, delta, dq,
                                accumulate, g, mask);
  if (err != cudaSuccess) return err;
  return LaunchTiles(FlashBackwardDkvKernel<T, G, R>, R, g.k_len, pairs, DkvFloats(R, g.d),
                     stream, dout, q, k, v, lse, delta, dk, dv, accumulate, g, mask);
}

template <typename T, int R>
cudaError_t BackwardT(const void* dout, const void* qkv, const void* out, const float* lse,
                      float* delta, void* dqkv, const FlashGeom& g, const AttentionMask& mask,
                      cudaStream_t stream) {
  cudaError_t err = DeltaT<T>(dout, out, delta, g, stream);
  if (err != cudaSuccess) return err;
  const T* q = static_cast<const T*>(qkv);
  T* dq = static_cast<T*>(dqkv);
  return GradsT<T, T, R>(static_cast<const T*>(dout), q, q + g.d, q + 2 * g.d, lse, delta, dq,
                         dq + g.d, dq + 2 * g.d, /*accumulate=*/false, g, mask, stream);
}

template <typename T, int R>
cudaError_t BlockForwardT(const FlashBlockArgs& a, float* acc, float* mx, float* sum,
                          const FlashGeom& g, const AttentionMask& mask, cudaStream_t stream) {
  const T* k = static_cast<const T*>(a.kv);
  return LaunchTiles(FlashForwardKernel<T, R, true>, R, g.q_len, g.b * g.heads,
                     ForwardFloats(R, g.d), stream, static_cast<const T*>(a.q), k, k + g.d,
                     static_cast<T*>(nullptr), static_cast<float*>(nullptr), acc, mx, sum, g,
                     mask);
}

template <typename T, int R>
cudaError_t BlockBackwardT(const FlashBlockArgs& a, const void* dout, const float* lse,
                           const float* delta, float* dq, float* dkv, const FlashGeom& g,
                           const AttentionMask& mask, cudaStream_t stream) {
  const T* k = static_cast<const T*>(a.kv);
  return GradsT<T, float, R>(static_cast<const T*>(dout), static_cast<const T*>(a.q), k, k + g.d,
                             lse, delta, dq, dkv, dkv + g.d, /*accumulate=*/true, g, mask, stream);
}

// acc = 0, m = -inf, l = 0 over n rows of d.
__global__ void FlashInitKernel(float* acc, float* mx, float* sum, int64_t n, int64_t d) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n * d;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc[t] = 0.0f;
    if (t < n) {
      mx[t] = -INFINITY;
      sum[t] = 0.0f;
    }
  }
}

// out[row, pair] = acc[pair, row] / l, lse = m + log(l) (0 and -inf without keys);
// one thread per (pair, row, e).
template <typename T>
__global__ void FlashFinishKernel(const float* acc, const float* mx, const float* sum, T* out,
                                  float* lse, int64_t rows, int64_t pairs, int64_t d) {
  const int64_t n = pairs * rows * d;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t st = t / d, e = t - st * d;  // st = pair * rows + row
    const int64_t pair = st / rows, row = st - pair * rows;
    const float l = sum[st];
    out[(row * pairs + pair) * d + e] = FromFloat<T>(l == 0.0f ? 0.0f : acc[t] * (1.0f / l));
    if (e == 0) lse[st] = l == 0.0f ? -INFINITY : mx[st] + logf(l);
  }
}

// n runs of `width` elements: dst[r * dst_stride + dst_first ...] = src[r * src_stride + src_first ...].
template <typename T>
__global__ void CopyRunsKernel(const T* src, int64_t src_stride, int64_t src_first, T* dst,
                               int64_t dst_stride, int64_t dst_first, int64_t n, int64_t width) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n * width;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / width, e = t - r * width;
    dst[r * dst_stride + dst_first + e] = src[r * src_stride + src_first + e];
  }
}

}  // namespace

cudaError_t FlashAttentionForward(Elem t, const void* qkv, void* out, float* lse, int64_t s,
                                  int64_t b, int64_t d, const AttentionMask& mask,
                                  cudaStream_t stream) {
  if (s * b * mask.heads == 0) return cudaSuccess;
  if (d <= 0 || d > kFlashMaxHeadDim) return cudaErrorInvalidValue;
  const FlashGeom g = Geom(s, b, d, mask);
  if (FlashRows(d) == 64) {
    LOOM_DISPATCH_FLOAT(t, T, return (ForwardT<T, 64>(qkv, out, lse, g, mask, stream)));
  } else {
    LOOM_DISPATCH_FLOAT(t, T, return (ForwardT<T, 32>(qkv, out, lse, g, mask, stream)));
  }
  return cudaErrorInvalidValue;
}

cudaError_t FlashAttentionBackward(Elem t, const void* dout, const void* qkv, const void* out,
                                   const float* lse, float* delta, void* dqkv, int64_t s,
                                   int64_t b, int64_t d, const AttentionMask& mask,
                                   cudaStream_t stream) {
  if (s * b * mask.heads == 0) return cudaSuccess;
  if (d <= 0 || d > kFlashMaxHeadDim) return cudaErrorInvalidValue;
  const FlashGeom g = Geom(s, b, d, mask);
  if (FlashRows(d) == 64) {
    LOOM_DISPATCH_FLOAT(
        t, T, return (BackwardT<T, 64>(dout, qkv, out, lse, delta, dqkv, g, mask, stream)));
  } else {
    LOOM_DISPATCH_FLOAT(
        t, T, return (BackwardT<T, 32>(dout, qkv, out, lse, delta, dqkv, g, mask, stream)));
  }
  return cudaErrorInvalidValue;
}

cudaError_t FlashBlockForward(Elem t, const FlashBlockArgs& a, float* acc, float* max,
                              float* sum, const AttentionMask& mask, cudaStream_t stream) {
  if (a.q_len * a.k_len * a.b * mask.heads == 0) return cudaSuccess;
  if (a.d <= 0 || a.d > kFlashMaxHeadDim) return cudaErrorInvalidValue;
  const FlashGeom g = BlockGeom(a, mask);
  if (FlashRows(a.d) == 64) {
    LOOM_DISPATCH_FLOAT(t, T, return (BlockForwardT<T, 64>(a, acc, max, sum, g, mask, stream)));
  } else {
    LOOM_DISPATCH_FLOAT(t, T, return (BlockForwardT<T, 32>(a, acc, max, sum, g, mask, stream)));
  }
  return cudaErrorInvalidValue;
}

cudaError_t FlashBlockBackward(Elem t, const FlashBlockArgs& a, const void* dout,
                               const float* lse, const float* delta, float* dq, float* dkv,
                               const AttentionMask& mask, cudaStream_t stream) {
  if (a.q_len * a.k_len * a.b * mask.heads == 0) return cudaSuccess;
  if (a.d <= 0 || a.d > kFlashMaxHeadDim) return cudaErrorInvalidValue;
  const FlashGeom g = BlockGeom(a, mask);
  if (FlashRows(a.d) == 64) {
    LOOM_DISPATCH_FLOAT(
        t, T, return (BlockBackwardT<T, 64>(a, dout, lse, delta, dq, dkv, g, mask, stream)));
  } else {
    LOOM_DISPATCH_FLOAT(
        t, T, return (BlockBackwardT<T, 32>(a, dout, lse, delta, dq, dkv, g, mask, stream)));
  }
  return cudaErrorInvalidValue;
}

cudaError_t FlashBlockDelta(Elem t, const void* dout, const void* out, int64_t rows, int64_t b,
                            int64_t heads, int64_t d, float* delta, cudaStream_t stream) {
  if (rows * b * heads * d == 0) return cudaSuccess;
  FlashGeom g{};
  g.b = b;
  g.heads = heads;
  g.d = d;
  g.q_len = g.st_rows = rows;
  g.ld_out = b * heads * d;
  LOOM_DISPATCH_FLOAT(t, T, return DeltaT<T>(dout, out, delta, g, stream));
  return cudaErrorInvalidValue;
}

cudaError_t FlashBlockInit(float* acc, float* max, float* sum, int64_t rows, int64_t d,
                           cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  FlashInitKernel<<<FlatBlocks(rows * d), 256, 0, stream>>>(acc, max, sum, rows, d);
  return cudaGetLastError();
}

cudaError_t FlashBlockFinish(Elem t, const float* acc, const float* max, const float* sum,
                             void* out, float* lse, int64_t rows, int64_t pairs, int64_t d,
                             cudaStream_t stream) {
  if (rows * pairs * d == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T, {
    FlashFinishKernel<T><<<FlatBlocks(rows * pairs * d), 256, 0, stream>>>(
        acc, max, sum, static_cast<T*>(out), lse, rows, pairs, d);
    return cudaGetLastError();
  });
  return cudaErrorInvalidValue;
}

cudaError_t CopyRuns(Elem t, const void* src, int64_t src_stride, int64_t src_first, void* dst,
                     int64_t dst_stride, int64_t dst_first, int64_t n, int64_t width,
                     cudaStream_t stream) {
  if (n * width == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T, {
    CopyRunsKernel<T><<<FlatBlocks(n * width), 256, 0, stream>>>(
        static_cast<const T*>(src), src_stride, src_first, static_cast<T*>(dst), dst_stride,
        dst_first, n, width);
    return cudaGetLastError();
  });
  return cudaErrorInvalidValue;
}

}  // namespace loom::core::cuda::kernels
