#ifndef LOOM_CORE_CPU_MATMUL_H_
#define LOOM_CORE_CPU_MATMUL_H_

// Single-precision GEMM through oneDNN's dnnl_sgemm (the fastest measured on
// our Zen 5 CPU; see //core:bench). Row-major throughout.

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

struct MatmulOptions {
  bool trans_a = false;  // use Aᵀ
  bool trans_b = false;  // use Bᵀ
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is overwritten (its old contents may be NaN); 1: accumulate
};

// C = alpha * op(A) * op(B) + beta * C.
//   a: f32[M, K] (or [K, M] with trans_a)
//   b: f32[K, N] (or [N, K] with trans_b)
//   c: f32[M, N] (read when beta != 0, written)
// A linear layer y = x·Wᵀ is Matmul(x, w, &y, {.trans_b = true});
// its grads are dX = dY·W (NN) and dW += dYᵀ·X ({.trans_a = true, .beta = 1}).
absl::Status Matmul(const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts = {});

// The same for a batch of independent products; the leading dims must agree.
//   a: f32[B, M, K] or f32[B1, B2, M, K] (last two dims swapped with trans_a)
//   b: f32[B, K, N] or f32[B1, B2, K, N] (last two dims swapped with trans_b)
//   c: f32[B, M, N] or f32[B1, B2, M, N]
absl::Status BatchedMatmul(const Tensor& a, const Tensor& b, Tensor* c,
                           const MatmulOptions& opts = {});

// The shape arithmetic shared by every device's GEMM: M, N, K of
// C = op(A)·op(B) from the last two dims (InvalidArgument naming both
// operands when inner dims or C disagree), and the batch count of a
// BatchedMatmul (all of rank 3 or all of rank 4, equal leading dims).
struct GemmDims {
  int64_t m, n, k;
};
absl::Status GemmMatrixDims(const char* op, const Tensor& a, const Tensor& b, const Tensor& c,
                            const MatmulOptions& opts, GemmDims* dims);
absl::StatusOr<int64_t> GemmBatchCount(const char* op, const Tensor& a, const Tensor& b,
                                       const Tensor& c);

// Raw strided form for kernels that multiply sub-matrices in place (attention).
// Row-major; lda/ldb/ldc are row strides in elements. No argument checks
// beyond what oneDNN does: the caller guarantees the extents. Inside an OpenMP
// parallel region it runs on the calling thread only.
absl::Status Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_MATMUL_H_
