// Element-wise kernels (bias, GELU, add, scale) and the column sums behind
// every parameter-gradient reduction (dbias, dgamma, dbeta).

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

template <typename T>
__global__ void BiasAddKernel(const T* x, const T* bias, T* out, int64_t n, int64_t c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(Load(x, i) + Load(bias, i % c));
  }
}

// Block (32, 8): 32 columns, 8 row lanes; blockIdx.y is the chunk of
// kColumnChunkRows rows. Partials are written, never accumulated, so the sum
// over chunks (AccumulatePartials) has a fixed order.
template <typename T, bool kWithX>
__global__ void ColumnPartialsKernel(const T* dout, const T* x, const float* mean,
                                     const float* rstd, int64_t rows, int64_t c, float* partials,
                                     float* gpartials) {
  __shared__ float sb[8][33];
  __shared__ float sg[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = blockIdx.x * int64_t{32} + tx;
  const int64_t r0 = blockIdx.y * kColumnChunkRows;
  const int64_t r1 = r0 + kColumnChunkRows < rows ? r0 + kColumnChunkRows : rows;
  float b = 0.0f, g = 0.0f;
  if (j < c) {
    for (int64_t r = r0 + ty; r < r1; r += 8) {
      const float d = Load(dout, r * c + j);
      b += d;
      if (kWithX) g += d * ((Load(x, r * c + j) - (mean != nullptr ? mean[r] : 0.0f)) * rstd[r]);
    }
  }
  sb[ty][tx] = b;
  sg[ty][tx] = g;
  __syncthreads();
  if (ty == 0 && j < c) {
    float tb = 0.0f, tg = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      tb += sb[k][tx];
      tg += sg[k][tx];
    }
    if (partials != nullptr) partials[blockIdx.y * c + j] = tb;
    if (kWithX) gpartials[blockIdx.y * c + j] = tg;
  }
}

template <typename G>
__global__ void AccumulatePartialsKernel(const float* partials, int64_t chunks, int64_t c, G* dst) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < c;
       j += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += partials[k * c + j];
    dst[j] = FromFloat<G>(Load(dst, j) + acc);
  }
}

// gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// the same formula as core/cpu/elementwise.cc (no cancellation for small u).
template <typename T>
__global__ void GeluKernel(const T* x, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = Load(x, i);
    const float u = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
    out[i] = FromFloat<T>(v / (1.0f + expf(-2.0f * u)));
  }
}

// With s = sigmoid(2u): gelu' = s + 2 x s (1 - s) u'(x).
template <typename T>
__global__ void GeluGradKernel(const T* x, const T* dout, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = Load(x, i);
    const float u = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v * v);
    const float s = 1.0f / (1.0f + expf(-2.0f * u));
    dx[i] = FromFloat<T>(Load(dout, i) * (s + 2.0f * v * s * (1.0f - s) * du));
  }
}

template <typename T>
__global__ void AddKernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(Load(a, i) + Load(b, i));
  }
}

template <typename T>
__global__ void ScaleKernel(float scale, T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = FromFloat<T>(Load(x, i) * scale);
  }
}

}  // namespace

cudaError_t BiasAdd(Elem t, const void* x, const void* bias, void* out, int64_t rows, int64_t c,
                    cudaStream_t stream) {
  const int64_t n = rows * c;
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      BiasAddKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
                          static_cast<const T*>(x), static_cast<const T*>(bias),
                          static_cast<T*>(out), n, c));
  return cudaGetLastError();
}

cudaError_t ColumnPartials(Elem t, const void* dout, const void* x, const float* mean,
                           const float* rstd, int64_t rows, int64_t c, float* partials,
                           float* gpartials, cudaStream_t stream) {
  if (rows == 0 || c == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((c + 31) / 32), static_cast<unsigned>(ColumnChunks(rows)));
  const dim3 block(32, 8);
  if (x != nullptr) {
    LOOM_DISPATCH_FLOAT(t, T,
                        ColumnPartialsKernel<T, true><<<grid, block, 0, stream>>>(
                            static_cast<const T*>(dout), static_cast<const T*>(x), mean, rstd,
                            rows, c, partials, gpartials));
  } else {
    LOOM_DISPATCH_FLOAT(t, T,
                        ColumnPartialsKernel<T, false><<<grid, block, 0, stream>>>(
                            static_cast<const T*>(dout), nullptr, nullptr, nullptr, rows, c,
                            partials, nullptr));
  }
  return cudaGetLastError();
}

cudaError_t AccumulatePartials(Elem g, const float* partials, int64_t chunks, int64_t c, void* dst,
                               cudaStream_t stream) {
  if (c == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(g, G,
                      AccumulatePartialsKernel<G><<<FlatBlocks(c), 256, 0, stream>>>(
                          partials, chunks, c, static_cast<G*>(dst)));
  return cudaGetLastError();
}

cudaError_t Gelu(Elem t, const void* x, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      GeluKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
                          static_cast<const T*>(x), static_cast<T*>(out), n));
  return cudaGetLastError();
}

cudaError_t GeluGrad(Elem t, const void* x, const void* dout, void* dx, int64_t n,
                     cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      GeluGradKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
                          static_cast<const T*>(x), static_cast<const T*>(dout),
                          static_cast<T*>(dx), n));
  return cudaGetLastError();
}

cudaError_t Add(Elem t, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      AddKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(
                          static_cast<const T*>(a), static_cast<const T*>(b),
                          static_cast<T*>(out), n));
  return cudaGetLastError();
}

cudaError_t Scale(Elem t, float scale, void* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  LOOM_DISPATCH_FLOAT(t, T,
                      ScaleKernel<T><<<FlatBlocks(n), 256, 0, stream>>>(scale, static_cast<T*>(x),
                                                                        n));
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
