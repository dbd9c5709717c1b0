#ifndef LOOM_CORE_CUDA_MATMUL_H_
#define LOOM_CORE_CUDA_MATMUL_H_

// GEMM on the GPU through cuBLAS, with the contract of core/cpu/matmul.h
// (row-major; C = alpha op(A) op(B) + beta C; beta = 0 never reads C).
// dtypes: a and b both f32 or both bf16; c of the same dtype, or f32 with
// bf16 a/b (e.g. weight gradients accumulated in f32). f32 runs with
// CUBLAS_COMPUTE_32F (no TF32); bf16 multiplies on tensor cores and
// accumulates in f32. Asynchronous on the current stream.

#include "absl/status/status.h"
#include "core/cpu/matmul.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   a: [M, K] (or [K, M] with trans_a); b: [K, N] (or [N, K]); c: [M, N]
absl::Status Matmul(const Tensor& a, const Tensor& b, Tensor* c,
                    const cpu::MatmulOptions& opts = {});

//   a: [B, M, K] or [B1, B2, M, K]; b, c likewise; leading dims must agree.
absl::Status BatchedMatmul(const Tensor& a, const Tensor& b, Tensor* c,
                           const cpu::MatmulOptions& opts = {});

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_MATMUL_H_
