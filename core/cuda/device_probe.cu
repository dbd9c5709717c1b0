// Compiled by nvcc for sm_90 (+ compute_90 PTX). Proves the toolchain end to
// end: a kernel, a launch, and copies. Plain C interface: no Abseil in .cu.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "core/cuda/device_probe_kernels.h"

namespace {

__global__ void FillKernel(float* out, int n, float value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + static_cast<float>(i);
}

int Fail(cudaError_t e, const char* what, char* err, int err_len) {
  std::snprintf(err, err_len, "%s failed: %s (%s)", what, cudaGetErrorName(e),
                cudaGetErrorString(e));
  return static_cast<int>(e);
}

}  // namespace

extern "C" int loom_cuda_device_count(int* count, char* err, int err_len) {
  cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess) {
    *count = 0;
    return Fail(e, "cudaGetDeviceCount", err, err_len);
  }
  return 0;
}

extern "C" int loom_cuda_fill_iota(float* host_out, int n, float value, char* err, int err_len) {
  float* dev = nullptr;
  cudaError_t e = cudaMalloc(&dev, sizeof(float) * (n > 0 ? n : 1));
  if (e != cudaSuccess) return Fail(e, "cudaMalloc", err, err_len);
  const int threads = 256;
  // No launch for n == 0 (a zero-block grid is an invalid configuration).
  if (n > 0) {
    FillKernel<<<static_cast<int>((static_cast<int64_t>(n) + threads - 1) / threads), threads>>>(
        dev, n, value);
  }
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(host_out, dev, sizeof(float) * n, cudaMemcpyDeviceToHost);
  cudaFree(dev);
  if (e != cudaSuccess) return Fail(e, "FillKernel launch/copy", err, err_len);
  return 0;
}
