#ifndef LOOM_CORE_CUDA_BLAS_H_
#define LOOM_CORE_CUDA_BLAS_H_

// cuBLAS plumbing: one handle (and a 32 MiB workspace) per device per host
// thread, bound to the thread's compute stream, and a row-major strided
// batched GEMM over it. Internal to //core/cuda (matmul.cc, attention.cc,
// the bench).

#include <cublas_v2.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace loom::core::cuda::internal {

// The calling thread's handle for its current device, set to CurrentStream().
absl::StatusOr<cublasHandle_t> BlasHandle();

// Row-major, for b < batch:
//   C_b = alpha op(A_b) op(B_b) + beta C_b,  X_b = x + b * stride_x (elements).
// A and B are of `ab`; C of `c` (== ab, or f32 with bf16 A/B). f32 math with
// CUBLAS_COMPUTE_32F (never TF32); bf16 products accumulate in f32.
// Requires k > 0; the caller checks extents (this only checks int ranges).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  DType ab = DType::kF32, c_dtype = DType::kF32;
};
absl::Status Gemm(const char* op, const GemmArgs& g);

const char* CublasStatusName(cublasStatus_t status);

}  // namespace loom::core::cuda::internal

#endif  // LOOM_CORE_CUDA_BLAS_H_
