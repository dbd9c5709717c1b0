#ifndef LOOM_CORE_CPU_CONVERT_H_
#define LOOM_CORE_CPU_CONVERT_H_

// fp32 <-> bf16 and fp32 <-> f16 conversion, round to nearest even.
// bf16: NaN stays NaN (made quiet, sign kept), ±Inf stays ±Inf, values that
// round past the largest finite bf16 become ±Inf, subnormals round exactly.
// f16 uses the CPU's F16C instructions (IEEE conversions with the same rules).

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToF16Bits(float f);
float F16BitsToFloat(uint16_t h);

// dst[i] = src[i] rounded to bf16 (nearest even; NaN stays a quiet NaN;
// subnormals kept), vectorised, in parallel chunks.
void F32ToBf16(const float* src, uint16_t* dst, int64_t n);

// dst = src converted element-wise. Supported pairs: f32 -> bf16, bf16 -> f32,
// f32 -> f16, f16 -> f32, and same-dtype copies.
//   src: [any];  dst: same numel (shapes may differ), the target dtype
absl::Status Convert(const Tensor& src, Tensor* dst);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_CONVERT_H_
