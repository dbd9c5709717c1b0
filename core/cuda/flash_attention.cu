// Flash attention on the GPU: core/cpu/flash_attention.h's algorithm (tiles
// of keys with an online softmax; no s x s matrix), the same causal mask,
// 1/sqrt(d) scale and dropout mask at the GLOBAL probabilities index
// ((b_i * total_heads + head_offset + h) * s + i) * s + j.
//
// One thread block per (query or key tile, pair); R = FlashRows(d) threads,
// one row each; the other operand's tile sits in shared memory, read by all
// threads at once (broadcast). Math in f32; qkv, out, dout, dqkv of type T.
//   forward:   block (query tile, pair): m, l, acc over key tiles; writes out, lse.
//   backward:  delta = rowsum(dO * O); block (query tile, pair) accumulates dQ
//              over key tiles; block (key tile, pair) accumulates dK, dV over
//              query tiles. No atomics: deterministic.

#include <cmath>

#include "core/cuda/device_util.cuh"
#include "core/cuda/philox_device.h"

namespace loom::core::cuda::kernels {
namespace {

struct FlashGeom {
  int64_t s, b, heads, d;
  int64_t ld_qkv, ld_out;  // row strides: b heads 3 d, b heads d
  float scale;             // 1 / sqrt(d)
};

// Element offset of row t of pair `pair`'s q (k: + d, v: + 2 d) in qkv.
__device__ __forceinline__ int64_t QkvRow(const FlashGeom& g, int64_t pair, int64_t t) {
  return t * g.ld_qkv + pair * 3 * g.d;
}
__device__ __forceinline__ int64_t OutRow(const FlashGeom& g, int64_t pair, int64_t t) {
  return t * g.ld_out + pair * g.d;
}

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

// keep / (1 - p) or 0 for element (i, j) of pair; 1 without dropout.
__device__ __forceinline__ float KeepFactor(const AttentionMask& m, const FlashGeom& g,
                                            int64_t pair, int64_t i, int64_t j) {
  if (!m.dropout) return 1.0f;
  const int64_t bi = pair / m.heads, h = pair - bi * m.heads;
  const uint64_t gpair = static_cast<uint64_t>(bi * m.total_heads + m.head_offset + h);
  const uint64_t index = (gpair * g.s + i) * static_cast<uint64_t>(g.s) + j;
  return DropoutBitsAtHD(m.params.seed, m.params.offset, index) >= m.params.threshold
             ? m.params.scale
             : 0.0f;
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

template <typename T, int R>
__global__ void __launch_bounds__(R) FlashForwardKernel(const T* qkv, T* out, float* lse,
                                                        FlashGeom g, AttentionMask m) {
  extern __shared__ float smem[];
  const int64_t d = g.d, dp = d + 1;  // padded private rows (no bank conflicts)
  float* qs = smem;          // [R, d + 1]
  float* acc = qs + R * dp;  // [R, d + 1]
  float* ks = acc + R * dp;  // [R, d]
  float* vs = ks + R * d;    // [R, d]
  const int64_t pair = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * R;
  const int tid = threadIdx.x;
  const int64_t i = q0 + tid;
  const T* q = qkv + pair * 3 * d;
  LoadTile<T, R>(q, g.ld_qkv, q0, g.s, d, qs, dp);
  for (int64_t e = 0; e < d; ++e) acc[tid * dp + e] = 0.0f;
  float mx = -INFINITY, l = 0.0f;
  const int64_t k_end = Min64(g.s, q0 + R);  // causal: keys up to the tile's last query
  for (int64_t k0 = 0; k0 < k_end; k0 += R) {
    __syncthreads();
    LoadTile<T, R>(q + d, g.ld_qkv, k0, g.s, d, ks, d);
    LoadTile<T, R>(q + 2 * d, g.ld_qkv, k0, g.s, d, vs, d);
    __syncthreads();
    if (i >= g.s) continue;
    const int n = static_cast<int>(Min64(R, i - k0 + 1));
    if (n <= 0) continue;
    float sc[R];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (j < n) {
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
      if (j < n) {
        const float p = expf(sc[j] - m_new);
        sum += p;
        sc[j] = p * KeepFactor(m, g, pair, i, k0 + j);
      }
    }
    l = l * alpha + sum;
    mx = m_new;
    for (int64_t e = 0; e < d; ++e) {
      float a = acc[tid * dp + e] * alpha;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (j < n) a += sc[j] * vs[j * d + e];
      }
      acc[tid * dp + e] = a;
    }
  }
  if (i >= g.s) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* o = out + OutRow(g, pair, i);
  for (int64_t e = 0; e < d; ++e) o[e] = FromFloat<T>(acc[tid * dp + e] * inv);
  lse[pair * g.s + i] = l > 0.0f ? mx + logf(l) : -INFINITY;
}

// delta[pair, i] = sum_e dout[i, e] out[i, e]; one thread per (pair, i).
template <typename T>
__global__ void FlashDeltaKernel(const T* dout, const T* out, float* delta, FlashGeom g) {
  const int64_t n = g.b * g.heads * g.s;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = t / g.s, i = t - pair * g.s;
    const int64_t row = OutRow(g, pair, i);
    float acc = 0.0f;
    for (int64_t e = 0; e < g.d; ++e) acc += Load(dout, row + e) * Load(out, row + e);
    delta[t] = acc;
  }
}

// dQ of one query tile: thread = query row i, K/V tiles in shared memory.
template <typename T, int R>
__global__ void __launch_bounds__(R) FlashBackwardDqKernel(const T* dout, const T* qkv,
                                                           const float* lse, const float* delta,
                                                           T* dqkv, FlashGeom g, AttentionMask m) {
  extern __shared__ float smem[];
  const int64_t d = g.d, dp = d + 1;
  float* qs = smem;          // [R, d + 1]
  float* dos = qs + R * dp;  // [R, d + 1]
  float* dqs = dos + R * dp; // [R, d + 1]
  float* ks = dqs + R * dp;  // [R, d]
  float* vs = ks + R * d;    // [R, d]
  const int64_t pair = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * R;
  const int tid = threadIdx.x;
  const int64_t i = q0 + tid;
  const T* q = qkv + pair * 3 * d;
  LoadTile<T, R>(q, g.ld_qkv, q0, g.s, d, qs, dp);
  LoadTile<T, R>(dout + pair * d, g.ld_out, q0, g.s, d, dos, dp);
  for (int64_t e = 0; e < d; ++e) dqs[tid * dp + e] = 0.0f;
  const float row_lse = i < g.s ? lse[pair * g.s + i] : -INFINITY;
  const float row_delta = i < g.s ? delta[pair * g.s + i] : 0.0f;
  const int64_t k_end = Min64(g.s, q0 + R);
  for (int64_t k0 = 0; k0 < k_end; k0 += R) {
    __syncthreads();
    LoadTile<T, R>(q + d, g.ld_qkv, k0, g.s, d, ks, d);
    LoadTile<T, R>(q + 2 * d, g.ld_qkv, k0, g.s, d, vs, d);
    __syncthreads();
    if (i >= g.s || row_lse == -INFINITY) continue;
    const int n = static_cast<int>(Min64(R, i - k0 + 1));
    for (int j = 0; j < n; ++j) {
      float qk = 0.0f, dpv = 0.0f;
      for (int64_t e = 0; e < d; ++e) {
        qk += qs[tid * dp + e] * ks[j * d + e];
        dpv += dos[tid * dp + e] * vs[j * d + e];
      }
      const float p = expf(qk * g.scale - row_lse);
      const float ds = p * (dpv * KeepFactor(m, g, pair, i, k0 + j) - row_delta) * g.scale;
      for (int64_t e = 0; e < d; ++e) dqs[tid * dp + e] += ds * ks[j * d + e];
    }
  }
  if (i >= g.s) return;
  T* dq = dqkv + QkvRow(g, pair, i);
  for (int64_t e = 0; e < d; ++e) dq[e] = FromFloat<T>(dqs[tid * dp + e]);
}

// dK, dV of one key tile: thread = key row j, query tiles in shared memory.
template <typename T, int R>
__global__ void __launch_bounds__(R) FlashBackwardDkvKernel(const T* dout, const T* qkv,
                                                            const float* lse, const float* delta,
                                                            T* dqkv, FlashGeom g,
                                                            AttentionMask m) {
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
  const int64_t pair = blockIdx.y, k0 = static_cast<int64_t>(blockIdx.x) * R;
  const int tid = threadIdx.x;
  const int64_t j = k0 + tid;
  const T* q = qkv + pair * 3 * d;
  LoadTile<T, R>(q + d, g.ld_qkv, k0, g.s, d, ks, dp);
  LoadTile<T, R>(q + 2 * d, g.ld_qkv, k0, g.s, d, vs, dp);
  for (int64_t e = 0; e < d; ++e) dks[tid * dp + e] = dvs[tid * dp + e] = 0.0f;
  for (int64_t q0 = k0; q0 < g.s; q0 += R) {  // causal: queries from the tile's first key
    __syncthreads();
    LoadTile<T, R>(q, g.ld_qkv, q0, g.s, d, qs, d);
    LoadTile<T, R>(dout + pair * d, g.ld_out, q0, g.s, d, dos, d);
    lse_s[tid] = q0 + tid < g.s ? lse[pair * g.s + q0 + tid] : -INFINITY;
    delta_s[tid] = q0 + tid < g.s ? delta[pair * g.s + q0 + tid] : 0.0f;
    __syncthreads();
    if (j >= g.s) continue;
    for (int r = 0; r < R; ++r) {
      const int64_t i = q0 + r;
      if (i >= g.s) break;
      if (i < j || lse_s[r] == -INFINITY) continue;
      float qk = 0.0f, dpv = 0.0f;
      for (int64_t e = 0; e < d; ++e) {
        qk += qs[r * d + e] * ks[tid * dp + e];
        dpv += dos[r * d + e] * vs[tid * dp + e];
      }
      const float p = expf(qk * g.scale - lse_s[r]);
      const float keep = KeepFactor(m, g, pair, i, j);
      const float pd = p * keep;
      const float ds = p * (dpv * keep - delta_s[r]) * g.scale;
      for (int64_t e = 0; e < d; ++e) {
        dvs[tid * dp + e] += pd * dos[r * d + e];
        dks[tid * dp + e] += ds * qs[r * d + e];
      }
    }
  }
  if (j >= g.s) return;
  T* dk = dqkv + QkvRow(g, pair, j) + d;
  for (int64_t e = 0; e < d; ++e) {
    dk[e] = FromFloat<T>(dks[tid * dp + e]);
    dk[d + e] = FromFloat<T>(dvs[tid * dp + e]);
  }
}

FlashGeom Geom(int64_t s, int64_t b, int64_t d, const AttentionMask& mask) {
  FlashGeom g;
  g.s = s;
  g.b = b;
  g.heads = mask.heads;
  g.d = d;
  g.ld_qkv = b * mask.heads * 3 * d;
  g.ld_out = b * mask.heads * d;
  g.scale = 1.0f / sqrtf(static_cast<float>(d));
  return g;
}

// Launches kernel on (tiles of R rows, pairs) with `floats` of dynamic shared memory.
template <typename Kernel, typename... Args>
cudaError_t LaunchTiles(Kernel kernel, int R, int64_t s, int64_t pairs, size_t floats,
                        cudaStream_t stream, Args... args) {
  const size_t bytes = floats * sizeof(float);
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((s + R - 1) / R), static_cast<unsigned>(pairs));
  kernel<<<grid, R, bytes, stream>>>(args...);
  return cudaGetLastError();
}

template <typename T, int R>
cudaError_t ForwardT(const void* qkv, void* out, float* lse, const FlashGeom& g,
                     const AttentionMask& mask, cudaStream_t stream) {
  return LaunchTiles(FlashForwardKernel<T, R>, R, g.s, g.b * g.heads, 2 * R * (g.d + 1) + 2 * R * g.d,
                     stream, static_cast<const T*>(qkv), static_cast<T*>(out), lse, g, mask);
}

template <typename T, int R>
cudaError_t BackwardT(const void* dout, const void* qkv, const void* out, const float* lse,
                      float* delta, void* dqkv, const FlashGeom& g, const AttentionMask& mask,
                      cudaStream_t stream) {
  const int64_t pairs = g.b * g.heads;
  FlashDeltaKernel<T><<<FlatBlocks(pairs * g.s), 256, 0, stream>>>(
      static_cast<const T*>(dout), static_cast<const T*>(out), delta, g);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = LaunchTiles(FlashBackwardDqKernel<T, R>, R, g.s, pairs, 3 * R * (g.d + 1) + 2 * R * g.d,
                    stream, static_cast<const T*>(dout), static_cast<const T*>(qkv), lse,
                    static_cast<const float*>(delta), static_cast<T*>(dqkv), g, mask);
  if (err != cudaSuccess) return err;
  return LaunchTiles(FlashBackwardDkvKernel<T, R>, R, g.s, pairs,
                     4 * R * (g.d + 1) + 2 * R * g.d + 2 * R, stream,
                     static_cast<const T*>(dout), static_cast<const T*>(qkv), lse,
                     static_cast<const float*>(delta), static_cast<T*>(dqkv), g, mask);
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

}  // namespace loom::core::cuda::kernels
