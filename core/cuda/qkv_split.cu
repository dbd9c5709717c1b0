// QKV split + RoPE (core/cpu/qkv_split.h): one block per token row, which
// owns every output element of that row, so the backward's k/v sums over a
// group's heads run in a fixed order in one thread (no atomics). The block
// computes its position's cos/sin once (the f32 angles of core/cpu/rope.h, as
// rope.cu's table) into shared memory. Work items are V-element chunks of a
// head row (V * sizeof(T) = 16 bytes where d, r / 2 and the pointers allow);
// a chunk in the first half of the rotary dims also does its partner r / 2
// further on.

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <typename T, int V>
__device__ __forceinline__ void LoadChunk(const T* p, float (&f)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) f[i] = Load(e, i);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) f[i] = Load(p, i);
  }
}

template <typename T, int V>
__device__ __forceinline__ void StoreChunk(const float (&f)[V], T* p) {
  if constexpr (V * sizeof(T) == 16) {
    union {
      uint4 raw;
      T e[V];
    } u;
#pragma unroll
    for (int i = 0; i < V; ++i) u.e[i] = FromFloat<T>(f[i]);
    *reinterpret_cast<uint4*>(p) = u.raw;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = FromFloat<T>(f[i]);
  }
}

// Copies V elements bit for bit.
template <typename T, int V>
__device__ __forceinline__ void CopyChunk(const T* src, T* dst) {
  if constexpr (V * sizeof(T) == 16) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) dst[i] = src[i];
  }
}

// cos / sign * sin of position `pos` for i < h (rotary dim 2h) into shared
// memory: RopeTableKernel's arithmetic (rope.cu), so the fused and unfused
// CUDA paths rotate by the same table. Ends with a barrier.
__device__ __forceinline__ void BlockAngles(float base, int64_t h, int64_t pos, float sign,
                                            float* cos, float* sin) {
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(2 * h);
    const float inv_freq =
        1.0f / static_cast<float>(pow(static_cast<double>(base), static_cast<double>(e)));
    const float theta = static_cast<float>(pos) * inv_freq;
    double sv, cv;
    sincos(static_cast<double>(theta), &sv, &cv);
    cos[i] = static_cast<float>(cv);
    sin[i] = sign * static_cast<float>(sv);
  }
  __syncthreads();
}

// Rotates the pair chunks (a0 at dim e, a1 at dim e + h) and stores them.
template <typename T, int V>
__device__ __forceinline__ void RotateStore(const float (&a0)[V], const float (&a1)[V],
                                            const float* cos, const float* sin, int64_t e,
                                            int64_t h, T* out) {
  float o0[V], o1[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float c = cos[e + i], s = sin[e + i];
    o0[i] = a0[i] * c - a1[i] * s;
    o1[i] = a1[i] * c + a0[i] * s;
  }
  StoreChunk<T, V>(o0, out + e);
  StoreChunk<T, V>(o1, out + e + h);
}

// proj [rows, groups, n + 2, d] -> qkv [rows, groups * n, 3, d]; h = r / 2
// (0: no rope).
template <typename T, int V>
__global__ void QkvSplitForwardKernel(const T* proj, int64_t batch, int64_t groups, int64_t n,
                                      int64_t d, int64_t h, float base, int64_t offset, T* qkv) {
  extern __shared__ float angles[];  // cos [h], sin [h]
  const int64_t t = blockIdx.x;
  if (h > 0) BlockAngles(base, h, t / batch + offset, 1.0f, angles, angles + h);
  const int64_t chunks = d / V, out_rows = groups * n * 3;
  const T* src = proj + t * groups * (n + 2) * d;
  T* dst = qkv + t * out_rows * d;
  for (int64_t k = threadIdx.x; k < out_rows * chunks; k += blockDim.x) {
    const int64_t row = k / chunks, e = (k - row * chunks) * V;
    const int64_t m = row / 3, slot = row - m * 3, g = m / n;
    const int64_t in_slot = slot == 0 ? m - g * n : n + slot - 1;
    const T* in = src + (g * (n + 2) + in_slot) * d;
    T* out = dst + row * d;
    if (slot < 2 && e < 2 * h) {
      if (e >= h) continue;  // the partner chunk's thread writes it
      float x0[V], x1[V];
      LoadChunk<T, V>(in + e, x0);
      LoadChunk<T, V>(in + e + h, x1);
      RotateStore<T, V>(x0, x1, angles, angles + h, e, h, out);
    } else {
      CopyChunk<T, V>(in + e, out + e);
    }
  }
}

// dqkv [rows, groups * n, 3, d] -> dproj [rows, groups, n + 2, d]: a k or v
// row sums the group's n heads in order (f32), then q and k rotate back.
template <typename T, int V>
__global__ void QkvSplitBackwardKernel(const T* dqkv, int64_t batch, int64_t groups, int64_t n,
                                       int64_t d, int64_t h, float base, int64_t offset,
                                       T* dproj) {
  extern __shared__ float angles[];
  const int64_t t = blockIdx.x;
  if (h > 0) BlockAngles(base, h, t / batch + offset, -1.0f, angles, angles + h);
  const int64_t chunks = d / V, out_rows = groups * (n + 2);
  const T* src = dqkv + t * groups * n * 3 * d;
  T* dst = dproj + t * out_rows * d;
  for (int64_t k = threadIdx.x; k < out_rows * chunks; k += blockDim.x) {
    const int64_t row = k / chunks, e = (k - row * chunks) * V;
    const int64_t g = row / (n + 2), j = row - g * (n + 2);
    const int64_t slot = j < n ? 0 : j - n + 1;  // q, k, v
    const bool rotate = slot < 2 && e < 2 * h;
    if (rotate && e >= h) continue;
    const T* heads = src + g * n * 3 * d;  // the group's [n, 3, d]
    float a0[V], a1[V];
    if (slot == 0) {
      LoadChunk<T, V>(heads + j * 3 * d + e, a0);
      if (rotate) LoadChunk<T, V>(heads + j * 3 * d + e + h, a1);
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) a0[i] = a1[i] = 0.0f;
      for (int64_t jj = 0; jj < n; ++jj) {
        const T* row_in = heads + (jj * 3 + slot) * d;
        float x[V];
        LoadChunk<T, V>(row_in + e, x);
#pragma unroll
        for (int i = 0; i < V; ++i) a0[i] += x[i];
        if (rotate) {
          LoadChunk<T, V>(row_in + e + h, x);
#pragma unroll
          for (int i = 0; i < V; ++i) a1[i] += x[i];
        }
      }
    }
    T* out = dst + row * d;
    if (rotate) {
      RotateStore<T, V>(a0, a1, angles, angles + h, e, h, out);
    } else {
      StoreChunk<T, V>(a0, out + e);
    }
  }
}

template <typename T, int V>
cudaError_t Launch(bool backward, const void* in, int64_t rows, int64_t batch, int64_t groups,
                   int64_t n, int64_t d, int64_t h, float base, int64_t offset, void* out,
                   cudaStream_t stream) {
  const int64_t items = groups * (backward ? n + 2 : 3 * n) * (d / V);
  const int threads = static_cast<int>(items >= 256 ? 256 : (items + 31) / 32 * 32);
  const size_t smem = static_cast<size_t>(2 * h) * sizeof(float);
  if (backward) {
    QkvSplitBackwardKernel<T, V><<<RowGrid(rows), threads, smem, stream>>>(
        static_cast<const T*>(in), batch, groups, n, d, h, base, offset, static_cast<T*>(out));
  } else {
    QkvSplitForwardKernel<T, V><<<RowGrid(rows), threads, smem, stream>>>(
        static_cast<const T*>(in), batch, groups, n, d, h, base, offset, static_cast<T*>(out));
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t Dispatch(bool backward, const void* in, int64_t rows, int64_t batch, int64_t groups,
                     int64_t n, int64_t d, int64_t r, float base, int64_t offset, void* out,
                     cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t h = r / 2;
  const bool vec = d % kVec == 0 && h % kVec == 0 &&
                   reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  return vec ? Launch<T, kVec>(backward, in, rows, batch, groups, n, d, h, base, offset, out, stream)
             : Launch<T, 1>(backward, in, rows, batch, groups, n, d, h, base, offset, out, stream);
}

cudaError_t QkvSplit(bool backward, Elem t, const void* in, int64_t rows, int64_t batch,
                     int64_t groups, int64_t n, int64_t d, int64_t r, float base, int64_t offset,
                     void* out, cudaStream_t stream) {
  if (rows == 0 || groups == 0 || d == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      return Dispatch<T>(backward, in, rows, batch, groups, n, d, r, base, offset,
                                         out, stream));
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t QkvSplitForward(Elem t, const void* proj, int64_t rows, int64_t batch, int64_t groups,
                            int64_t n, int64_t d, int64_t r, float base, int64_t offset, void* qkv,
                            cudaStream_t stream) {
  return QkvSplit(false, t, proj, rows, batch, groups, n, d, r, base, offset, qkv, stream);
}

cudaError_t QkvSplitBackward(Elem t, const void* dqkv, int64_t rows, int64_t batch, int64_t groups,
                             int64_t n, int64_t d, int64_t r, float base, int64_t offset,
                             void* dproj, cudaStream_t stream) {
  return QkvSplit(true, t, dqkv, rows, batch, groups, n, d, r, base, offset, dproj, stream);
}

}  // namespace loom::core::cuda::kernels
