#ifndef LOOM_CORE_CPU_VEC_MATH_H_
#define LOOM_CORE_CPU_VEC_MATH_H_

// Branch-free float math that GCC auto-vectorises inside `#pragma omp simd`
// loops (glibc's expf only vectorises under -ffast-math, which we do not use).

#include <cmath>
#include <cstdint>
#include <cstring>

// GCC 12's AVX-512 headers initialise their "undefined" vectors from
// themselves, which -Wall reports at every inlined use; silence that here.
// The first inclusion is the one that counts (include guards): a kernel that
// uses AVX-512 gets <immintrin.h> from here, not directly before this header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace loom::core::cpu::internal {

// True when the CPU has AVX-512 (F, BW, DQ, VL) and LOOM_CPU_NO_AVX512 is
// unset or "0". Decided once per process.
bool UseAvx512();

}  // namespace loom::core::cpu::internal

// Compute-bound loops are compiled twice: for the build's baseline
// (x86-64-v3, AVX2) and for x86-64-v4 with 512-bit vectors, chosen at run
// time by UseAvx512(). Write the loop once as a LOOM_CPU_INLINE function
// `NameBody`, then
//   LOOM_CPU_MULTIVERSION(Name, (const float* x, int64_t n), (x, n))
// defines `void Name(const float* x, int64_t n)` that dispatches to a copy of
// NameBody compiled for each target. Both copies run the same operations in
// the same order (no reassociation), so they give bitwise-identical results.
//
// The hottest kernels (GELU, softmax forward, LayerNorm) instead have a
// hand-written AVX-512 variant `NameV4` (LOOM_CPU_V4, intrinsics: polynomial
// exp with vscalefps, rcp14 + a Newton step instead of a divide, several
// vector accumulators) next to the AVX2 `NameBody`:
//   LOOM_CPU_DISPATCH_V4(Name, params, args)
// RULE for those: the two paths are NOT bitwise identical; each is within the
// tests' accuracy tolerances of the double reference (tests run both paths),
// and each path is deterministic (same inputs and thread count, same bits).
// Dropout is exact integer arithmetic: its masks and outputs stay
// bit-identical on every path (layout independence depends on that).
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
#define LOOM_CPU_V4 __attribute__((target("arch=x86-64-v4,prefer-vector-width=512")))
#define LOOM_CPU_DISPATCH_V4(name, params, args)                      \
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

// ---- AVX-512 helpers (call only from LOOM_CPU_V4 functions) ----

// exp(z), 16 lanes, max relative error ~2 ulp for z in [-87.3, 88.7]: z is
// clamped to that range (so +-Inf and huge inputs give ~1.2e-38 / ~3.4e38
// instead of 0 / Inf; NaN stays NaN), n = round(z / ln 2), Cody-Waite
// r = z - n ln 2 in two FMAs, a degree-5 minimax polynomial on
// [-ln2/2, ln2/2] (ARM optimized-routines' expf), then vscalefps by 2^n.
// `clamp_hi` = false skips the upper clamp where z <= 0 is known.
template <bool clamp_hi = true>
LOOM_CPU_V4 LOOM_CPU_INLINE __m512 Exp512(__m512 z) {
  z = _mm512_max_ps(z, _mm512_set1_ps(-87.3365478515625f));
  if (clamp_hi) z = _mm512_min_ps(z, _mm512_set1_ps(88.72283172607421875f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(z, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), z);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(0x1.0e4020p-7f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.573e2ep-5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.555e66p-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.fffdb6p-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.ffffecp-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 2^w, 16 lanes, for w = z log2(e) (the caller folds log2(e) into the FMA
// that produces its argument): same polynomial as Exp512 with ln 2 folded into
// its coefficients; t = w - round(w) is exact, so this saves Exp512's
// multiply and one Cody-Waite FMA. w is clamped to [-126, 127] (127 only if
// `clamp_hi`: pass false where w <= ~0 is known); NaN stays NaN.
template <bool clamp_hi = true>
LOOM_CPU_V4 LOOM_CPU_INLINE __m512 Exp2Poly512(__m512 w) {
  w = _mm512_max_ps(w, _mm512_set1_ps(-126.0f));
  if (clamp_hi) w = _mm512_min_ps(w, _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_roundscale_ps(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 t = _mm512_sub_ps(w, n);
  __m512 p = _mm512_set1_ps(0.0013196047117671112f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.009671936793650302f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.05550986676563706f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.2402223116047261f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.6931467674120305f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 2^(h - 0.5) for h = w + 0.5 (callers fold the +0.5 into the FMA that
// produces h): t = h - floor(h) in [0, 1) by one vreduceps (instead of
// roundscale + sub), then Exp2Poly512's polynomial re-expanded around
// t - 0.5 (all coefficients positive: no cancellation in Horner), and
// vscalefps by 2^floor(h). h is clamped to [-125.5, 127.5] (127.5 only if
// `clamp_hi`).
template <bool clamp_hi = true>
LOOM_CPU_V4 LOOM_CPU_INLINE __m512 Exp2PolyHalf512(__m512 h) {
  h = _mm512_max_ps(h, _mm512_set1_ps(-125.5f));
  if (clamp_hi) h = _mm512_min_ps(h, _mm512_set1_ps(127.5f));
  const __m512 t = _mm512_reduce_ps(h, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(0x1.59ed2cp-10f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0x1.a1a7f0p-8f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0x1.434c1ep-5f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0x1.5bc872p-3f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0x1.f5e57ep-2f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0x1.6a09e4p-1f));
  return _mm512_scalef_ps(p, h);
}

// 1 / d to ~1 ulp: rcp14 and one Newton step.
LOOM_CPU_V4 LOOM_CPU_INLINE __m512 Rcp512(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}

// x / d to ~1 ulp: x * rcp14(d), then one residual correction.
LOOM_CPU_V4 LOOM_CPU_INLINE __m512 Div512(__m512 x, __m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  const __m512 q = _mm512_mul_ps(x, r);
  return _mm512_fmadd_ps(_mm512_fnmadd_ps(d, q, x), r, q);
}

// Mask of the first n lanes (0 <= n <= 16).
LOOM_CPU_V4 LOOM_CPU_INLINE __mmask16 TailMask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

}  // namespace loom::core::cpu::internal

#endif  // LOOM_CORE_CPU_VEC_MATH_H_
