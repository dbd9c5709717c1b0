// The residual path fused with the norm after it (residual_norm_kernels.h):
// one block per row, f32 math, 16-byte loads where the row's pointers are
// 16-byte aligned (4 f32 / 8 bf16), a scalar loop for the rest of the row.
// Every rounding of the unfused kernels (Dropout, Add, Norm) is kept: the
// dropped branch and the sum are rounded to T where the unfused path stores
// them, so resid (and the dx/dbranch of the backward) equal the unfused
// kernels' bit for bit; out and dx differ only by the order of the row sums.

#include "core/cuda/device_util.cuh"
#include "core/cuda/philox_device.h"
#include "core/cuda/residual_norm_kernels.h"

namespace loom::core::cuda::kernels {
namespace {

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// v as the unfused kernels store it in T, read back in f32.
__device__ __forceinline__ float Rounded(float v, const float*) { return v; }
__device__ __forceinline__ float Rounded(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) f[i] = Load(e, i);
}

template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float* f) {
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) e[i] = FromFloat<T>(f[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// keep[j] = element (row, j) survives dropout, j < c: one Philox evaluation
// per 8 elements (DropoutBlockBits), any alignment of the row's global start.
__device__ void KeepFlags(const ResidualNormParams& p, int64_t row, uint8_t* keep) {
  const uint64_t g0 = static_cast<uint64_t>(p.first + row * p.stride);
  const uint64_t g1 = g0 + static_cast<uint64_t>(p.c);  // exclusive
  const uint64_t first_group = g0 >> 7, last_group = (g1 - 1) >> 7;
  const int64_t blocks = static_cast<int64_t>(last_group - first_group + 1) * 16;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    const uint64_t block = first_group * 16 + static_cast<uint64_t>(b);
    uint32_t bits[8];
    DropoutBlockBits(p.seed, p.offset, block, bits);
    const uint64_t e0 = (block >> 4) * 128 + (block & 15);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint64_t e = e0 + 16 * k;
      if (e >= g0 && e < g1) keep[e - g0] = bits[k] >= p.threshold ? 1 : 0;
    }
  }
}

// smem: [kStage: c floats, the row of resid in f32][kDropout: c keep bytes].
template <typename T, bool kCentered, bool kDropout, bool kStage>
__global__ void ResidualNormForwardKernel(const T* x, const T* branch, const T* gamma,
                                          const T* beta, T* resid, T* out, float* mean,
                                          float* rstd, ResidualNormParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[32];
  constexpr int N = kVec<T>;
  const int64_t row = blockIdx.x, c = p.c;
  float* srow = reinterpret_cast<float*>(smem);
  uint8_t* keep = smem + (kStage ? c * static_cast<int64_t>(sizeof(float)) : 0);
  if (kDropout) {
    KeepFlags(p, row, keep);
    __syncthreads();
  }
  const T* xr = x + row * c;
  const T* br = branch + row * c;
  T* rr = resid + row * c;
  T* orow = out + row * c;
  const bool vec = Aligned16(xr) && Aligned16(br) && Aligned16(rr) && Aligned16(orow) &&
                   Aligned16(gamma) && (!kCentered || Aligned16(beta));
  const int64_t nv = vec ? c / N : 0, tail = nv * N;
  const float inv_c = 1.0f / static_cast<float>(c);
  // The unfused path's values: Dropout stores T(b * scale) (or 0), Add T(that + x).
  auto sum_of = [&](float xv, float bv, int64_t j) {
    if (kDropout) bv = keep[j] ? bv * p.scale : 0.0f;
    return Rounded(Rounded(bv, xr) + xv, xr);
  };
  float acc = 0.0f;  // LayerNorm: sum; RMSNorm: sum of squares
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    float xv[N], bv[N];
    LoadVec(xr + v * N, xv);
    LoadVec(br + v * N, bv);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      bv[i] = sum_of(xv[i], bv[i], v * N + i);
      acc += kCentered ? bv[i] : bv[i] * bv[i];
      if (kStage) srow[v * N + i] = bv[i];
    }
    StoreVec(rr + v * N, bv);
  }
  for (int64_t j = tail + threadIdx.x; j < c; j += blockDim.x) {
    const float r = sum_of(Load(xr, j), Load(br, j), j);
    acc += kCentered ? r : r * r;
    if (kStage) srow[j] = r;
    rr[j] = FromFloat<T>(r);
  }
  // Each thread reads back only the elements it wrote (same mapping), from
  // shared memory or from resid itself.
  auto at = [&](int64_t j) { return kStage ? srow[j] : Load(rr, j); };
  float m = 0.0f, var;
  if (kCentered) {
    m = BlockReduce(acc, SumOp(), red) * inv_c;
    acc = 0.0f;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float d = at(v * N + i) - m;
        acc += d * d;
      }
    }
    for (int64_t j = tail + threadIdx.x; j < c; j += blockDim.x) {
      const float d = at(j) - m;
      acc += d * d;
    }
  }
  var = BlockReduce(acc, SumOp(), red);
  const float s = 1.0f / sqrtf(var * inv_c + p.eps);
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    float g[N], b[N], y[N];
    LoadVec(gamma + v * N, g);
    if (kCentered) LoadVec(beta + v * N, b);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      y[i] = (at(v * N + i) - m) * s * g[i];
      if (kCentered) y[i] = y[i] + b[i];
    }
    StoreVec(orow + v * N, y);
  }
  for (int64_t j = tail + threadIdx.x; j < c; j += blockDim.x) {
    const float y = (at(j) - m) * s * Load(gamma, j);
    orow[j] = FromFloat<T>(kCentered ? y + Load(beta, j) : y);
  }
  if (threadIdx.x == 0) {
    if (kCentered) mean[row] = m;
    rstd[row] = s;
  }
}

// dx = T(T(Norm'(dout)) + dresid), dbranch = T(dropout'(dx)): the unfused
// NormBackwardDx, Add and Dropout kernels' roundings. smem: [kDropout: c keep
// bytes]. Each thread reads dout/dresid[j] before it writes dx[j], and only
// its own j: dx may alias dout or dresid.
template <typename T, bool kCentered, bool kDropout, bool kBranch>
__global__ void ResidualNormBackwardKernel(const T* dout, const T* dresid, const T* resid,
                                           const T* gamma, const float* mean, const float* rstd,
                                           T* dx, T* dbranch, ResidualNormParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[32];
  constexpr int N = kVec<T>;
  const int64_t row = blockIdx.x, c = p.c;
  uint8_t* keep = smem;
  if (kDropout) {
    KeepFlags(p, row, keep);
    __syncthreads();
  }
  const T* dr = dout + row * c;
  const T* rr = dresid + row * c;
  const T* xr = resid + row * c;
  T* dxr = dx + row * c;
  T* dbr = kBranch ? dbranch + row * c : nullptr;
  const bool vec = Aligned16(dr) && Aligned16(rr) && Aligned16(xr) && Aligned16(dxr) &&
                   Aligned16(gamma) && (!kBranch || Aligned16(dbr));
  const int64_t nv = vec ? c / N : 0, tail = nv * N;
  const float m = kCentered ? mean[row] : 0.0f, s = rstd[row];
  const float inv_c = 1.0f / static_cast<float>(c);
  float a = 0.0f, b = 0.0f;
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    float g[N], d[N], xv[N];
    LoadVec(gamma + v * N, g);
    LoadVec(dr + v * N, d);
    LoadVec(xr + v * N, xv);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float dn = g[i] * d[i];
      a += dn;
      b += dn * ((xv[i] - m) * s);
    }
  }
  for (int64_t j = tail + threadIdx.x; j < c; j += blockDim.x) {
    const float dn = Load(gamma, j) * Load(dr, j);
    a += dn;
    b += dn * ((Load(xr, j) - m) * s);
  }
  const float mean_dn = kCentered ? BlockReduce(a, SumOp(), red) * inv_c : 0.0f;
  const float mean_dn_n = BlockReduce(b, SumOp(), red) * inv_c;
  auto grad = [&](float g, float d, float xv, float res, float* branch_grad, int64_t j) {
    const float n = (xv - m) * s;
    const float v = Rounded(Rounded(s * (g * d - mean_dn - n * mean_dn_n), xr) + res, xr);
    if (kBranch) *branch_grad = kDropout ? (keep[j] ? v * p.scale : 0.0f) : v;
    return v;
  };
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    float g[N], d[N], xv[N], res[N], out[N], db[N];
    LoadVec(gamma + v * N, g);
    LoadVec(dr + v * N, d);
    LoadVec(xr + v * N, xv);
    LoadVec(rr + v * N, res);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = grad(g[i], d[i], xv[i], res[i], &db[i], v * N + i);
    StoreVec(dxr + v * N, out);
    if (kBranch) StoreVec(dbr + v * N, db);
  }
  for (int64_t j = tail + threadIdx.x; j < c; j += blockDim.x) {
    float db = 0.0f;
    const float v = grad(Load(gamma, j), Load(dr, j), Load(xr, j), Load(rr, j), &db, j);
    dxr[j] = FromFloat<T>(v);
    if (kBranch) dbr[j] = FromFloat<T>(db);
  }
}

// Threads for a row of c elements read N at a time.
int Threads(int64_t c, int n) { return RowThreads((c + n - 1) / n); }

constexpr int64_t kDefaultSmem = 48 * 1024;

template <typename K>
cudaError_t AllowSmem(K kernel, int64_t bytes) {
  if (bytes <= kDefaultSmem) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

template <typename T, bool kCentered, bool kDropout, bool kStage>
cudaError_t LaunchForward(const void* x, const void* branch, const void* gamma, const void* beta,
                          void* resid, void* out, float* mean, float* rstd,
                          const ResidualNormParams& p, cudaStream_t stream) {
  const int64_t smem = (kStage ? p.c * 4 : 0) + (kDropout ? p.c : 0);
  auto kernel = ResidualNormForwardKernel<T, kCentered, kDropout, kStage>;
  const cudaError_t err = AllowSmem(kernel, smem);
  if (err != cudaSuccess) return err;
  kernel<<<RowGrid(p.rows), Threads(p.c, kVec<T>), static_cast<size_t>(smem), stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(branch), static_cast<const T*>(gamma),
      static_cast<const T*>(beta), static_cast<T*>(resid), static_cast<T*>(out), mean, rstd, p);
  return cudaGetLastError();
}

template <typename T, bool kCentered, bool kDropout, bool kBranch>
cudaError_t LaunchBackward(const void* dout, const void* dresid, const void* resid,
                           const void* gamma, const float* mean, const float* rstd, void* dx,
                           void* dbranch, const ResidualNormParams& p, cudaStream_t stream) {
  const int64_t smem = kDropout ? p.c : 0;
  auto kernel = ResidualNormBackwardKernel<T, kCentered, kDropout, kBranch>;
  const cudaError_t err = AllowSmem(kernel, smem);
  if (err != cudaSuccess) return err;
  kernel<<<RowGrid(p.rows), Threads(p.c, kVec<T>), static_cast<size_t>(smem), stream>>>(
      static_cast<const T*>(dout), static_cast<const T*>(dresid), static_cast<const T*>(resid),
      static_cast<const T*>(gamma), mean, rstd, static_cast<T*>(dx), static_cast<T*>(dbranch), p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Forward(const void* x, const void* branch, const void* gamma, const void* beta,
                    void* resid, void* out, float* mean, float* rstd, const ResidualNormParams& p,
                    cudaStream_t stream) {
  // The f32 row stays in shared memory while it fits without an opt-in;
  // wider rows are read back from resid (L2-resident: this block wrote it).
  const bool stage = p.c * 4 + (p.dropout ? p.c : 0) <= kDefaultSmem;
#define LOOM_RN_FWD(C, D, S) \
  if ((!p.rms) == C && p.dropout == D && stage == S) \
    return LaunchForward<T, C, D, S>(x, branch, gamma, beta, resid, out, mean, rstd, p, stream);
  LOOM_RN_FWD(true, true, true)
  LOOM_RN_FWD(true, true, false)
  LOOM_RN_FWD(true, false, true)
  LOOM_RN_FWD(true, false, false)
  LOOM_RN_FWD(false, true, true)
  LOOM_RN_FWD(false, true, false)
  LOOM_RN_FWD(false, false, true)
  LOOM_RN_FWD(false, false, false)
#undef LOOM_RN_FWD
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t Backward(const void* dout, const void* dresid, const void* resid, const void* gamma,
                     const float* mean, const float* rstd, void* dx, void* dbranch,
                     const ResidualNormParams& p, cudaStream_t stream) {
  const bool branch = dbranch != nullptr, drop = branch && p.dropout;
#define LOOM_RN_BWD(C, D, B) \
  if ((!p.rms) == C && drop == D && branch == B) \
    return LaunchBackward<T, C, D, B>(dout, dresid, resid, gamma, mean, rstd, dx, dbranch, p, \
                                      stream);
  LOOM_RN_BWD(true, true, true)
  LOOM_RN_BWD(true, false, true)
  LOOM_RN_BWD(true, false, false)
  LOOM_RN_BWD(false, true, true)
  LOOM_RN_BWD(false, false, true)
  LOOM_RN_BWD(false, false, false)
#undef LOOM_RN_BWD
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t ResidualNormForward(Elem t, const void* x, const void* branch, const void* gamma,
                                const void* beta, void* resid, void* out, float* mean, float* rstd,
                                const ResidualNormParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.c == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      return Forward<T>(x, branch, gamma, beta, resid, out, mean, rstd, p, stream));
  return cudaErrorInvalidValue;
}

cudaError_t ResidualNormBackwardDx(Elem t, const void* dout, const void* dresid, const void* resid,
                                   const void* gamma, const float* mean, const float* rstd,
                                   void* dx, void* dbranch, const ResidualNormParams& p,
                                   cudaStream_t stream) {
  if (p.rows == 0 || p.c == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      return Backward<T>(dout, dresid, resid, gamma, mean, rstd, dx, dbranch, p,
                                         stream));
  return cudaErrorInvalidValue;
}

}  // namespace loom::core::cuda::kernels
