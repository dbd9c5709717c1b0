#ifndef LOOM_CORE_CPU_VEC_MATH_H_
#define LOOM_CORE_CPU_VEC_MATH_H_

// Branch-free float math that GCC auto-vectorises inside `#pragma omp simd`
// loops (glibc's expf only vectorises under -ffast-math, which we do not use).

#include <cmath>
#include <cstdint>
#include <cstring>

namespace loom::core::cpu::internal {

// True when the CPU has AVX-512 (F, BW, DQ, VL) and LOOM_CPU_NO_AVX512 is
// unset or "0". Decided once per process.
bool UseAvx512();

}  // namespace loom::core::cpu::internal

// Compute-bound loops are compiled twice: for the build's baseline
// (x86-64-v3, AVX2) and for x86-64-v4 with 512-bit vectors, chosen at run
// time by UseAvx512(). Both run the same operations in the same order (no
// reassociation), so they give bitwise-identical results; tests run both.
// Write the loop once as a LOOM_CPU_INLINE function `NameBody`, then
//   LOOM_CPU_MULTIVERSION(Name, (const float* x, int64_t n), (x, n))
// defines `void Name(const float* x, int64_t n)` that dispatches to a copy of
// NameBody compiled for each target.
#define LOOM_CPU_INLINE __attribute__((always_inline)) inline
#define LOOM_CPU_MULTIVERSION(name, params, args)                     \
  __attribute__((target("arch=x86-64-v4,prefer-vector-width=512"),    \
                 noinline)) void name##V4 params {                    \
    name##Body args;                                                  \
  }                                                                   \
  __attribute__((noinline)) void name##V3 params { name##Body args; } \
  void name params {                                                  \
    if (::loom::core::cpu::internal::UseAvx512()) {                   \
      name##V4 args;                                                  \
    } else {                                                          \
      name##V3 args;                                                  \
    }                                                                 \
  }

namespace loom::core::cpu::internal {

// exp(x) to within 2 ulp of glibc's expf for x in [-87.3, 88.7] (Cephes
// polynomial, Cody-Waite range reduction). Below -87.3 it returns ~1.2e-38
// instead of a subnormal or 0 (an absolute error below 1.2e-38); NaN stays NaN.
inline float ExpF(float x) {
  x = x < -87.3365478515625f ? -87.3365478515625f : x;
  x = x > 88.72283172607421875f ? 88.72283172607421875f : x;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (floorf is a libm call under
  // -ftrapping-math, which would stop vectorisation).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// sum_{i < n} f(i) with 32 independent partial sums, so the loop is bound by
// throughput rather than by the latency of one vector accumulator. `f` must
// be a simple inlinable expression of i.
template <typename F>
inline float SumOf(int64_t n, F f) {
  float acc[32] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 32; ++l) acc[l] += f(i + l);
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += f(i);
  for (int l = 0; l < 16; ++l) acc[l] += acc[l + 16];
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  float s = tail;
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

// max_{i < n} x[i] (-Inf for n == 0), with independent partial maxima.
inline float MaxOf(const float* x, int64_t n) {
  float acc[32];
  for (int l = 0; l < 32; ++l) acc[l] = -INFINITY;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 32; ++l) acc[l] = acc[l] > x[i + l] ? acc[l] : x[i + l];
  }
  float m = -INFINITY;
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  for (int l = 0; l < 32; ++l) m = m > acc[l] ? m : acc[l];
  return m;
}

}  // namespace loom::core::cpu::internal

#endif  // LOOM_CORE_CPU_VEC_MATH_H_
