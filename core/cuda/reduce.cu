// Whole-tensor sums in double: a fixed grid of kReduceBlocks blocks writes
// one partial each, one block adds them in order (deterministic).

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double BlockSumDouble(double v, double* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) r += smem[w];
  return r;
}

template <typename T>
__global__ void PartialSumKernel(const T* x, int64_t n, bool squares, double* partials) {
  __shared__ double smem[kThreads / 32];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const double v = Load(x, i);
    acc += squares ? v * v : v;
  }
  acc = BlockSumDouble(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void FinalSumKernel(const double* partials, double* result, bool accumulate) {
  __shared__ double smem[kThreads / 32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < kReduceBlocks; i += kThreads) acc += partials[i];
  acc = BlockSumDouble(acc, smem);
  if (threadIdx.x == 0) *result = accumulate ? *result + acc : acc;
}

}  // namespace

cudaError_t ReduceToDouble(Elem t, const void* x, int64_t n, bool squares, double* partials,
                           double* result, cudaStream_t stream, bool accumulate) {
  // Launched even for n == 0, so *result is always written (0).
  LOOM_DISPATCH_FLOAT(t, T,
                      PartialSumKernel<T><<<kReduceBlocks, kThreads, 0, stream>>>(
                          static_cast<const T*>(x), n, squares, partials));
  FinalSumKernel<<<1, kThreads, 0, stream>>>(partials, result, accumulate);
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
