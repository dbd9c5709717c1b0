#include "core/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/cpu/parallel.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;

// sin and cos of an f32 angle, each rounded once to f32 from a double
// evaluation (error ~1e-16 relative: the f32 nearest to the exact value in
// nearly all cases), in branch-free code that vectorises, unlike glibc's.
// Reduction: k = round(x 2/pi), r = x - k pi/2 with pi/2 in two doubles; the
// first FMA is exact for f32 x (both terms are multiples of 2^-52 and the
// difference is below 2), so r is accurate for any f32 x below 2^51.
// fdlibm's __kernel_sin / __kernel_cos polynomials on |r| <= pi/4.
LOOM_CPU_INLINE void SinCosF32(float theta, float* sin_out, float* cos_out) {
  constexpr double kTwoOverPi = 0.63661977236758134308;
  constexpr double kPiOver2Hi = 1.57079632679489655800e+00;  // double(pi / 2)
  constexpr double kPiOver2Lo = 6.12323399573676603587e-17;  // pi / 2 - kPiOver2Hi
  constexpr double kRound = 6755399441055744.0;              // 1.5 * 2^52
  const double x = theta;
  // t - kRound = round(x 2/pi); the low bits of t's mantissa are k mod 4.
  const double t = x * kTwoOverPi + kRound;
  const double k = t - kRound;
  uint64_t bits;
  std::memcpy(&bits, &t, sizeof(bits));
  const uint64_t q = bits & 3;
  double r = std::fma(-k, kPiOver2Hi, x);
  r = std::fma(-k, kPiOver2Lo, r);
  const double z = r * r;
  double ps = 1.58969099521155010221e-10;
  ps = ps * z - 2.50507602534068634195e-08;
  ps = ps * z + 2.75573137070700676789e-06;
  ps = ps * z - 1.98412698298579493134e-04;
  ps = ps * z + 8.33333333332248946124e-03;
  ps = ps * z - 1.66666666666666324348e-01;
  const double s = r + r * z * ps;
  double pc = -1.13596475577881948265e-11;
  pc = pc * z + 2.08757232129817482790e-09;
  pc = pc * z - 2.75573143513906633035e-07;
  pc = pc * z + 2.48015872894767294178e-05;
  pc = pc * z - 1.38888888888741095749e-03;
  pc = pc * z + 4.16666666666666019037e-02;
  const double c = 1.0 - 0.5 * z + z * z * pc;
  // Quadrant q: sin x = (s, c, -s, -c)[q], cos x = (c, -s, -c, s)[q].
  const double sv = (q & 1) != 0 ? c : s;
  const double cv = (q & 1) != 0 ? s : c;
  *sin_out = static_cast<float>((q & 2) != 0 ? -sv : sv);
  *cos_out = static_cast<float>(((q + 1) & 2) != 0 ? -cv : cv);
}

LOOM_CPU_INLINE void RopeCosSinRangeBody(int64_t position, const float* inv_freq, int64_t n,
                                         float* cos, float* sin) {
  const float p = static_cast<float>(position);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) SinCosF32(p * inv_freq[i], &sin[i], &cos[i]);
}
LOOM_CPU_MULTIVERSION(RopeCosSinRange,
                      (int64_t position, const float* inv_freq, int64_t n, float* cos, float* sin),
                      (position, inv_freq, n, cos, sin))

// One head: pairs (i, i + h) for i < h = r / 2. orow may be xr: each pair is
// read before it is written.
LOOM_CPU_INLINE void RopeRotateRowBody(const float* xr, const float* cos, const float* sin,
                                       int64_t h, float* orow) {
#pragma omp simd
  for (int64_t i = 0; i < h; ++i) {
    const float x0 = xr[i], x1 = xr[i + h];
    orow[i] = x0 * cos[i] - x1 * sin[i];
    orow[i + h] = x1 * cos[i] + x0 * sin[i];
  }
}
LOOM_CPU_MULTIVERSION(RopeRotateRow,
                      (const float* xr, const float* cos, const float* sin, int64_t h, float* orow),
                      (xr, cos, sin, h, orow))

// Rotates every head of x by `sign` * theta (RopeForward: +1, RopeBackward: -1).
absl::Status Rope(const char* op, const char* x_name, const Tensor& x, const char* out_name,
                  const RopeOptions& o, float sign, Tensor* out) {
  LOOM_RETURN_IF_ERROR(CheckInput(op, x_name, x));
  LOOM_RETURN_IF_ERROR(CheckOutput(op, out_name, out));
  LOOM_ASSIGN_OR_RETURN(const int64_t r, CheckRopeArgs(op, x_name, x, o));
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, x_name, x, out_name, *out));
  // [S, B, H, D] as rows of D: row = (s * B + b) * H + h.
  const int64_t heads = x.dim(1) * x.dim(2), d = x.dim(3), h = r / 2;
  const int64_t rows = x.dim(0) * heads;
  std::vector<float> inv_freq(h);
  internal::RopeInvFreq(o.base, r, inv_freq.data());
  const float* px = x.data<float>();
  float* po = out->data<float>();
  // Each thread's run of rows; cos/sin are computed once per position it meets.
  internal::ParallelRowRuns(rows, [&](int64_t lo, int64_t hi) {
    std::vector<float> cos(h), sin(h);
    int64_t s_cached = -1;
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t s = row / heads;
      if (s != s_cached) {
        RopeCosSinRange(s + o.position_offset, inv_freq.data(), h, cos.data(), sin.data());
        if (sign < 0) {
          for (float& v : sin) v = -v;
        }
        s_cached = s;
      }
      const float* xr = px + row * d;
      float* orow = po + row * d;
      RopeRotateRow(xr, cos.data(), sin.data(), h, orow);
      if (orow != xr) std::copy(xr + r, xr + d, orow + r);
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> CheckRopeArgs(const char* op, const char* x_name, const Tensor& x,
                                      const RopeOptions& o) {
  if (x.rank() != 4 || x.dim(3) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", x_name, " is ", internal::Describe(x),
                     ", expected [S, B, H, D] (sequence, batch, heads, head dim) with D > 0"));
  }
  const int64_t d = x.dim(3);
  if (!(o.base > 0.0f) || !std::isfinite(o.base)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": RopeOptions.base is ", o.base, ", expected a finite value > 0"));
  }
  const int64_t r = o.rotary_dim == 0 ? d : o.rotary_dim;
  if (r < 0 || r > d || r % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": RopeOptions.rotary_dim is ", o.rotary_dim, " for ", x_name, " ", x.DebugString(),
        ": expected an even value in (0, head dim ", d, "], or 0 for the whole head",
        o.rotary_dim == 0 ? " (which needs an even head dim)" : ""));
  }
  if (o.position_offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": RopeOptions.position_offset is ",
                                                   o.position_offset, ", expected >= 0"));
  }
  return r;
}

absl::Status RopeForward(const Tensor& x, const RopeOptions& o, Tensor* out) {
  return Rope("RopeForward", "x", x, "out", o, 1.0f, out);
}

absl::Status RopeBackward(const Tensor& dout, const RopeOptions& o, Tensor* dx) {
  return Rope("RopeBackward", "dout", dout, "dx", o, -1.0f, dx);
}

namespace internal {

void RopeInvFreq(float base, int64_t r, float* inv_freq) {
  for (int64_t i = 0; i < r / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(r);
    inv_freq[i] =
        1.0f / static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
  }
}

void RopeCosSin(int64_t position, const float* inv_freq, int64_t n, float* cos, float* sin) {
  RopeCosSinRange(position, inv_freq, n, cos, sin);
}

void RopeRotate(const float* x, const float* cos, const float* sin, int64_t h, float* out) {
  RopeRotateRow(x, cos, sin, h, out);
}

}  // namespace internal

}  // namespace loom::core::cpu
