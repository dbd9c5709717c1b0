#ifndef LOOM_CORE_CUDA_BLASLT_H_
#define LOOM_CORE_CUDA_BLASLT_H_

// cuBLASLt plumbing: one handle and a 32 MiB workspace per device per host
// thread, and a row-major GEMM with an epilogue (bias, GELU keeping its
// input, dGELU with the bias gradient, the bias gradient of an operand).
// Internal to //core/cuda (linear.cc, the bench).
//
// Row-major C[m, n] = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ, so
// cuBLASLt's A is Loom's B and its B is Loom's A, with m and n swapped
// (as blas.h's Gemm). The epilogues' vectors in row-major terms:
//   kBias, kGeluAuxBias: bias [n], added to every row of C (cuBLASLt: one per
//     row of its column-major D); kGeluAuxBias writes C = gelu(z) and
//     aux = z (row-major [m, n], leading dim ldaux, a multiple of 8).
//   kDGelu: C = gelu'(aux) ⊙ (op(A) op(B)) (aux as above);
//   kDGeluBGrad: that and bias = Σ_rows C ([n]).
//   kBGradOfA: bias = Σ_k op(A)[·, j] over k, i.e. [m] (cuBLASLt's BGRADB,
//     its B being Loom's A): the bias gradient of dW = dYᵀ·X (A = dY, trans_a).
// Bias gradients are written, not accumulated, in C's dtype (cuBLASLt's
// rule); the bias of kBias/kGeluAuxBias and aux have C's dtype too.
// f32 math (CUBLAS_COMPUTE_32F, no TF32); A and B of one dtype, C of theirs
// or f32 (bf16 A/B).

#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace loom::core::cuda::internal {

enum class Epilogue { kNone, kBias, kGeluAuxBias, kDGelu, kDGeluBGrad, kBGradOfA };
const char* EpilogueName(Epilogue e);

struct LtGemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  DType ab = DType::kF32, c_dtype = DType::kF32;
  Epilogue epilogue = Epilogue::kNone;
  void* bias = nullptr;  // the bias (read) or bias gradient (written), see above
  void* aux = nullptr;   // GELU's input: written by kGeluAuxBias, read by kDGeluBGrad
  int64_t ldaux = 0;
};

// Unimplemented when cuBLASLt offers no algorithm for the call (the caller
// falls back to the unfused kernels); Internal on a failed launch.
// Requires m, n, k > 0.
absl::Status LtGemm(const char* op, const LtGemmArgs& g);

}  // namespace loom::core::cuda::internal

#endif  // LOOM_CORE_CUDA_BLASLT_H_
