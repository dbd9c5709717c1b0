#include "core/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {

namespace internal {
LOOM_CPU_INLINE void SoftmaxRowBody(const float* x, float* y, int64_t n, float scale) {
  const float mx = MaxOf(x, n) * scale;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = ExpF(x[j] * scale - mx);
  const float inv = 1.0f / SumOf(n, [&](int64_t j) { return y[j]; });
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
}
// AVX-512: max in 4 accumulators; y = exp(x scale - max) stored and summed in
// 4 accumulators; y *= 1 / sum over the L1-resident row.
// kClampHi = false when scale >= 0: then x scale - max <= 0 (or NaN) and
// Exp512 needs no upper clamp.
template <bool kClampHi>
LOOM_CPU_V4 LOOM_CPU_INLINE void SoftmaxRowV4Impl(const float* x, float* y, int64_t n,
                                                 float scale) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + j));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + j + 16));
    m2 = _mm512_max_ps(m2, _mm512_loadu_ps(x + j + 32));
    m3 = _mm512_max_ps(m3, _mm512_loadu_ps(x + j + 48));
  }
  for (; j < n; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, n - j));
    m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(ninf, k, x + j));
  }
  // Base 2: y = 2^(x scale log2e - max scale log2e) (Exp2Poly512).
  constexpr float kLog2e = 1.44269504088896341f;
  const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3))) * scale;
  const __m512 vmx = _mm512_set1_ps(mx * kLog2e - 0.5f), vs = _mm512_set1_ps(scale * kLog2e);
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  j = 0;
  for (; j + 64 <= n; j += 64) {
    const __m512 e0 = Exp2PolyHalf512<kClampHi>(_mm512_fmsub_ps(_mm512_loadu_ps(x + j), vs, vmx));
    const __m512 e1 = Exp2PolyHalf512<kClampHi>(_mm512_fmsub_ps(_mm512_loadu_ps(x + j + 16), vs, vmx));
    const __m512 e2 = Exp2PolyHalf512<kClampHi>(_mm512_fmsub_ps(_mm512_loadu_ps(x + j + 32), vs, vmx));
    const __m512 e3 = Exp2PolyHalf512<kClampHi>(_mm512_fmsub_ps(_mm512_loadu_ps(x + j + 48), vs, vmx));
    _mm512_storeu_ps(y + j, e0);
    _mm512_storeu_ps(y + j + 16, e1);
    _mm512_storeu_ps(y + j + 32, e2);
    _mm512_storeu_ps(y + j + 48, e3);
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
    s2 = _mm512_add_ps(s2, e2);
    s3 = _mm512_add_ps(s3, e3);
  }
  for (; j < n; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, n - j));
    const __m512 e = _mm512_maskz_mov_ps(
        k, Exp2PolyHalf512<kClampHi>(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, x + j), vs, vmx)));
    _mm512_mask_storeu_ps(y + j, k, e);
    s0 = _mm512_add_ps(s0, e);
  }
  const __m512 inv = _mm512_set1_ps(
      1.0f / _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3))));
  j = 0;
  for (; j + 32 <= n; j += 32) {
    _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), inv));
    _mm512_storeu_ps(y + j + 16, _mm512_mul_ps(_mm512_loadu_ps(y + j + 16), inv));
  }
  for (; j < n; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, n - j));
    _mm512_mask_storeu_ps(y + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + j), inv));
  }
}
LOOM_CPU_V4 __attribute__((noinline)) void SoftmaxRowV4(const float* x, float* y, int64_t n,
                                                        float scale) {
  if (scale >= 0.0f) {
    SoftmaxRowV4Impl<false>(x, y, n, scale);
  } else {
    SoftmaxRowV4Impl<true>(x, y, n, scale);
  }
}
LOOM_CPU_DISPATCH_V4(SoftmaxRow, (const float* x, float* y, int64_t n, float scale),
                     (x, y, n, scale))
}  // namespace internal

namespace {
absl::Status CheckRows(const char* op, const Tensor& x) {
  if (x.rank() < 1 || x.dim(x.rank() - 1) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " needs rank >= 1 and a non-empty last dim"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status SoftmaxForward(const Tensor& x, Tensor* out) {
  constexpr const char* kOp = "SoftmaxForward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  LOOM_RETURN_IF_ERROR(CheckRows(kOp, x));
  const int64_t c = x.dim(x.rank() - 1), rows = x.numel() / c;
  const float* px = x.data<float>();
  float* po = out->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) internal::SoftmaxRow(px + r * c, po + r * c, c, 1.0f);
  return absl::OkStatus();
}

absl::Status SoftmaxBackward(const Tensor& out, const Tensor& dout, Tensor* dx) {
  constexpr const char* kOp = "SoftmaxBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "out", out, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "out", out, "dx", *dx));
  LOOM_RETURN_IF_ERROR(CheckRows(kOp, out));
  const int64_t c = out.dim(out.rank() - 1), rows = out.numel() / c;
  const float* py = out.data<float>();
  const float* pd = dout.data<float>();
  float* pdx = dx->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* y = py + r * c;
    const float* d = pd + r * c;
    float* g = pdx + r * c;
    const float dot = internal::SumOf(c, [&](int64_t j) { return y[j] * d[j]; });
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) g[j] = y[j] * (d[j] - dot);
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
