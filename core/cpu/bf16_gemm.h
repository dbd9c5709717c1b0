#ifndef LOOM_CORE_CPU_BF16_GEMM_H_
#define LOOM_CORE_CPU_BF16_GEMM_H_

// bf16 GEMM with f32 accumulation and an f32 result, through oneDNN's matmul
// primitive (AMX tiles where the CPU has AMX-BF16, AVX512_BF16 dot products
// otherwise; oneDNN picks at run time). Only on CPUs that pass
// CheckBf16GemmSupport (cpu_features.h): callers check once, up front.
// Matmul (matmul.h) calls this when an operand is bf16 or
// MatmulOptions::bf16 is set; this header is for kernels that need the raw form.

#include <cstdint>

#include "absl/status/status.h"

namespace loom::core::cpu {

// c = alpha * op(a) * op(b) + beta * c, row-major with row strides lda/ldb/ldc
// in elements, as Sgemm (matmul.h); a and b are bf16 bits. beta == 0
// overwrites c (its old contents may be NaN). A primitive per (shape,
// transposes, strides, alpha, beta) is created once per thread and reused.
absl::Status Bf16Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                      float* c, int64_t ldc);

// dst[i] = bf16(src[i]) rounded to nearest even, n elements, OpenMP over the
// cores. With AVX512_BF16 it is VCVTNE2PS2BF16, which also flushes subnormal
// inputs to zero (irrelevant to GEMM operands: they are below bf16's
// resolution of any sum they enter); elsewhere F32ToBf16 (convert.h).
void ConvertF32ToBf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_BF16_GEMM_H_
