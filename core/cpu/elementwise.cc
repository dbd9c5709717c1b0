#include "core/cpu/elementwise.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;
using internal::ExpF;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// Rows of the last dimension, checked against bias [C].
absl::Status CheckBias(const char* op, const char* x_name, const Tensor& x, const Tensor& bias) {
  return ops::CheckLastDimVector(op, x_name, x, "bias", bias);
}

// Elements per parallel task of the flat kernels.
constexpr int64_t kChunk = 1 << 13;

// 0.5 (1 + tanh(u)) == sigmoid(2u): no cancellation for small u.
LOOM_CPU_INLINE void GeluForwardRangeBody(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
    y[i] = v / (1.0f + ExpF(-2.0f * u));
  }
}
// AVX-512: gelu = x / (1 + exp(z)), z = -2u = x (a + b x^2), evaluated in
// base 2: w = z log2(e) = x (a' + b' x^2) with log2(e) folded into a and b;
// Exp2PolyHalf512(w + 0.5) splits off floor with one vreduceps, evaluates
// 2^t by a degree-5 polynomial and scales with vscalefps; a Newton-refined
// rcp14 replaces the divide. 4 vectors per iteration keep more independent
// chains in flight.
LOOM_CPU_V4 LOOM_CPU_INLINE __m512 GeluForward16(__m512 v) {
  constexpr float kLog2e = 1.44269504088896341f;
  const __m512 a = _mm512_set1_ps(-2.0f * kSqrt2OverPi * kLog2e);
  const __m512 b = _mm512_set1_ps(-2.0f * kSqrt2OverPi * kGeluCoeff * kLog2e);
  // h = w + 0.5 (one FMA) for Exp2PolyHalf512, which clamps h to
  // [-125.5, 127.5] (+-Inf inputs stay finite here).
  const __m512 h = _mm512_fmadd_ps(_mm512_fmadd_ps(b, _mm512_mul_ps(v, v), a), v,
                                   _mm512_set1_ps(0.5f));
  const __m512 d = _mm512_add_ps(internal::Exp2PolyHalf512(h), _mm512_set1_ps(1.0f));
  return internal::Div512(v, d);
}
LOOM_CPU_V4 __attribute__((noinline)) void GeluForwardRangeV4(const float* x, float* y,
                                                              int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
    const __m512 v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
    _mm512_storeu_ps(y + i, GeluForward16(v0));
    _mm512_storeu_ps(y + i + 16, GeluForward16(v1));
    _mm512_storeu_ps(y + i + 32, GeluForward16(v2));
    _mm512_storeu_ps(y + i + 48, GeluForward16(v3));
  }
  for (; i < n; i += 16) {
    const __mmask16 k = internal::TailMask(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(y + i, k, GeluForward16(_mm512_maskz_loadu_ps(k, x + i)));
  }
}
LOOM_CPU_DISPATCH_V4(GeluForwardRange, (const float* x, float* y, int64_t n), (x, y, n))

// With s = sigmoid(2u): gelu = x s, gelu' = s + 2 x s (1 - s) u'(x).
LOOM_CPU_INLINE void GeluBackwardRangeBody(const float* x, const float* dout, float* dx,
                                           int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v * v);
    const float s = 1.0f / (1.0f + ExpF(-2.0f * u));
    dx[i] = dout[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
}
// AVX-512: s = 1 / (1 + exp(-2u)); dx = dout (s + x s (1 - s) 2u'(x)).
LOOM_CPU_V4 LOOM_CPU_INLINE __m512 GeluBackward16(__m512 v, __m512 d) {
  // exp(z) as 2^(z log2e) with log2e folded into a and b (Exp2Poly512).
  constexpr float kLog2e = 1.44269504088896341f;
  const __m512 a = _mm512_set1_ps(-2.0f * kSqrt2OverPi * kLog2e);
  const __m512 b = _mm512_set1_ps(-2.0f * kSqrt2OverPi * kGeluCoeff * kLog2e);
  const __m512 c1 = _mm512_set1_ps(2.0f * kSqrt2OverPi);
  const __m512 c3 = _mm512_set1_ps(2.0f * 3.0f * kSqrt2OverPi * kGeluCoeff);
  const __m512 v2 = _mm512_mul_ps(v, v);
  const __m512 z = _mm512_mul_ps(_mm512_fmadd_ps(b, v2, a), v);
  const __m512 s = internal::Rcp512(_mm512_add_ps(internal::Exp2Poly512(z), _mm512_set1_ps(1.0f)));
  const __m512 du2 = _mm512_fmadd_ps(c3, v2, c1);    // 2 u'(x)
  const __m512 t = _mm512_mul_ps(_mm512_fnmadd_ps(s, s, s), v);  // x s (1 - s)
  return _mm512_mul_ps(d, _mm512_fmadd_ps(t, du2, s));
}
LOOM_CPU_V4 __attribute__((noinline)) void GeluBackwardRangeV4(const float* x, const float* dout,
                                                               float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 r0 = GeluBackward16(_mm512_loadu_ps(x + i), _mm512_loadu_ps(dout + i));
    const __m512 r1 = GeluBackward16(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(dout + i + 16));
    _mm512_storeu_ps(dx + i, r0);
    _mm512_storeu_ps(dx + i + 16, r1);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = internal::TailMask(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(
        dx + i, k,
        GeluBackward16(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, dout + i)));
  }
}
LOOM_CPU_DISPATCH_V4(GeluBackwardRange, (const float* x, const float* dout, float* dx, int64_t n),
                     (x, dout, dx, n))

// AVX-512 dbias block: for rows [r0, r1) of the [rows, c] matrix, the f32
// column sums (rows added in order, exactly like the L1 block_sum loop, so the
// bits are the same) are kept in up to 16 zmm accumulators per column strip
// and then added into the double row `acc`.
template <int kVecs>
LOOM_CPU_V4 LOOM_CPU_INLINE void ColumnStripSumV4(const float* pd, int64_t c, int64_t r0,
                                                 int64_t r1, int64_t j0, __mmask16 last,
                                                 double* acc) {
  __m512 s[kVecs];
  for (int v = 0; v < kVecs; ++v) s[v] = _mm512_setzero_ps();
  for (int64_t r = r0; r < r1; ++r) {
    const float* dr = pd + r * c + j0;
    for (int v = 0; v < kVecs - 1; ++v) s[v] = _mm512_add_ps(s[v], _mm512_loadu_ps(dr + 16 * v));
    s[kVecs - 1] =
        _mm512_add_ps(s[kVecs - 1], _mm512_maskz_loadu_ps(last, dr + 16 * (kVecs - 1)));
  }
  for (int v = 0; v < kVecs; ++v) {
    const __mmask16 k = v == kVecs - 1 ? last : static_cast<__mmask16>(0xffff);
    double* a = acc + j0 + 16 * v;
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(s[v]));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(s[v], 1));
    const __mmask8 klo = static_cast<__mmask8>(k), khi = static_cast<__mmask8>(k >> 8);
    _mm512_mask_storeu_pd(a, klo, _mm512_add_pd(_mm512_maskz_loadu_pd(klo, a), lo));
    _mm512_mask_storeu_pd(a + 8, khi, _mm512_add_pd(_mm512_maskz_loadu_pd(khi, a + 8), hi));
  }
}
LOOM_CPU_V4 __attribute__((noinline)) void BiasBackwardBlockV4(const float* pd, int64_t c,
                                                               int64_t r0, int64_t r1,
                                                               double* acc) {
  constexpr int64_t kStrip = 16 * 16;
  int64_t j0 = 0;
  for (; j0 + kStrip <= c; j0 += kStrip) {
    ColumnStripSumV4<16>(pd, c, r0, r1, j0, 0xffff, acc);
  }
  // Remaining < 256 columns: strips of 64 columns, then one masked strip.
  for (; j0 + 64 <= c; j0 += 64) ColumnStripSumV4<4>(pd, c, r0, r1, j0, 0xffff, acc);
  for (; j0 < c; j0 += 16) {
    ColumnStripSumV4<1>(pd, c, r0, r1, j0, internal::TailMask(std::min<int64_t>(16, c - j0)),
                        acc);
  }
}

}  // namespace

absl::Status BiasAddForward(const Tensor& x, const Tensor& bias, Tensor* out) {
  constexpr const char* kOp = "BiasAddForward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "bias", bias));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckBias(kOp, "x", x, bias));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  const int64_t c = bias.dim(0);
  if (c == 0) return absl::OkStatus();
  const int64_t rows = x.numel() / c;
  const float* px = x.data<float>();
  const float* pb = bias.data<float>();
  float* po = out->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * c;
    float* orow = po + r * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) orow[j] = xr[j] + pb[j];
  }
  return absl::OkStatus();
}

absl::Status BiasAddBackward(const Tensor& dout, Tensor* dbias) {
  constexpr const char* kOp = "BiasAddBackward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dbias", dbias));
  LOOM_RETURN_IF_ERROR(CheckBias(kOp, "dout", dout, *dbias));
  const int64_t c = dbias->dim(0);
  if (c == 0) return absl::OkStatus();
  const int64_t rows = dout.numel() / c;
  const float* pd = dout.data<float>();
  float* pb = dbias->data<float>();
  // Each thread sums blocks of kRowBlock rows in f32 and adds every block sum
  // into a private double row; the private rows are added in thread order.
  constexpr int64_t kRowBlock = 32;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int nthreads = omp_get_max_threads();
  std::vector<double> partial(static_cast<size_t>(nthreads) * c, 0.0);
  const bool avx512 = internal::UseAvx512();
#pragma omp parallel num_threads(nthreads)
  {
    double* acc = partial.data() + static_cast<size_t>(omp_get_thread_num()) * c;
    std::vector<float> block_sum(avx512 ? 0 : c);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t r0 = blk * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
      if (avx512) {
        BiasBackwardBlockV4(pd, c, r0, r1, acc);
        continue;
      }
      std::fill(block_sum.begin(), block_sum.end(), 0.0f);
      float* bs = block_sum.data();
      for (int64_t r = r0; r < r1; ++r) {
        const float* dr = pd + r * c;
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) bs[j] += dr[j];
      }
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) acc[j] += bs[j];
    }
  }
  for (int t = 0; t < nthreads; ++t) {
    const double* acc = partial.data() + static_cast<size_t>(t) * c;
    for (int64_t j = 0; j < c; ++j) pb[j] = static_cast<float>(pb[j] + acc[j]);
  }
  return absl::OkStatus();
}

absl::Status GeluForward(const Tensor& x, Tensor* out) {
  constexpr const char* kOp = "GeluForward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  const int64_t n = x.numel();
  const float* px = x.data<float>();
  float* po = out->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    GeluForwardRange(px + c0, po + c0, std::min(kChunk, n - c0));
  }
  return absl::OkStatus();
}

absl::Status GeluBackward(const Tensor& x, const Tensor& dout, Tensor* dx) {
  constexpr const char* kOp = "GeluBackward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "dx", *dx));
  const int64_t n = x.numel();
  const float* px = x.data<float>();
  const float* pd = dout.data<float>();
  float* pdx = dx->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    GeluBackwardRange(px + c0, pd + c0, pdx + c0, std::min(kChunk, n - c0));
  }
  return absl::OkStatus();
}

absl::Status Add(const Tensor& a, const Tensor& b, Tensor* out) {
  constexpr const char* kOp = "Add";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "a", a));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "b", b));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "a", a, "b", b));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "a", a, "out", *out));
  const int64_t n = a.numel();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out->data<float>();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
  return absl::OkStatus();
}

absl::Status Scale(float scale, Tensor* x) {
  constexpr const char* kOp = "Scale";
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "x", x));
  const int64_t n = x->numel();
  float* px = x->data<float>();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) px[i] *= scale;
  return absl::OkStatus();
}

namespace {

// Zero-fills [p, p + bytes) with non-temporal stores: a large buffer (the
// gradients, 0.5 GB at GPT-2-small) is written without first reading every
// line into the cache, about twice memset's rate on two cores here.
void StreamZero(char* p, int64_t bytes) {
  const int64_t head = std::min<int64_t>(bytes, (32 - reinterpret_cast<uintptr_t>(p) % 32) % 32);
  std::memset(p, 0, static_cast<size_t>(head));
  const int64_t body = (bytes - head) / 32 * 32;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t i = head; i < head + body; i += 32) {
    _mm256_stream_ps(reinterpret_cast<float*>(p + i), zero);
  }
  std::memset(p + head + body, 0, static_cast<size_t>(bytes - head - body));
  _mm_sfence();  // on this thread, before the region's barrier publishes the zeros
}

}  // namespace

absl::Status Zero(Tensor* t) {
  if (t == nullptr || !t->defined()) return absl::InvalidArgumentError("Zero: undefined tensor");
  char* p = static_cast<char*>(t->raw_data());
  const int64_t bytes = static_cast<int64_t>(t->nbytes());
  constexpr int64_t kBlock = int64_t{1} << 20;  // bytes per task
  if (bytes <= 4 * kBlock) {
    std::memset(p, 0, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < bytes; b += kBlock) {
    StreamZero(p + b, std::min(kBlock, bytes - b));
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
