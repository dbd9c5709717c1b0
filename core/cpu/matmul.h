#ifndef LOOM_CORE_CPU_MATMUL_H_
#define LOOM_CORE_CPU_MATMUL_H_

// Single-precision GEMM through oneDNN's dnnl_sgemm (the fastest measured on
// our Zen 5 CPU; see //core:bench), and bf16 GEMM with f32 accumulation through
// oneDNN's matmul primitive (bf16_gemm.h) on CPUs with AVX512_BF16 or AMX-BF16.
// Row-major throughout.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::MatmulOptions;  // the contract's options (core/ops/contracts/options.h)

// C = alpha * op(A) * op(B) + beta * C.
//   a: f32[M, K] (or [K, M] with trans_a)
//   b: f32[K, N] (or [N, K] with trans_b)
//   c: f32[M, N] (read when beta != 0, written)
// bf16 mode (an operand is bf16, or opts.bf16): a and b may each be f32 or
// bf16 (f32 ones are rounded to nearest even bf16 first), c is f32 or bf16
// (bf16: computed in f32, rounded once at the end); the products are exact
// and summed in f32. Needs a CPU passing CheckBf16GemmSupport
// (cpu_features.h); elsewhere it returns that FailedPrecondition.
// A linear layer y = x·Wᵀ is Matmul(x, w, &y, {.trans_b = true});
// its grads are dX = dY·W (NN) and dW += dYᵀ·X ({.trans_a = true, .beta = 1}).
absl::Status Matmul(const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts = {});

// The same for a batch of independent products; the leading dims must agree
// (f32 only).
//   a: f32[B, M, K] or f32[B1, B2, M, K] (last two dims swapped with trans_a)
//   b: f32[B, K, N] or f32[B1, B2, K, N] (last two dims swapped with trans_b)
//   c: f32[B, M, N] or f32[B1, B2, M, N]
absl::Status BatchedMatmul(const Tensor& a, const Tensor& b, Tensor* c,
                           const MatmulOptions& opts = {});

// Raw strided form for kernels that multiply sub-matrices in place (attention).
// Row-major; lda/ldb/ldc are row strides in elements. No argument checks
// beyond what oneDNN does: the caller guarantees the extents. Inside an OpenMP
// parallel region it runs on the calling thread only.
absl::Status Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_MATMUL_H_
