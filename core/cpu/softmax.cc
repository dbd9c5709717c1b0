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
LOOM_CPU_MULTIVERSION(SoftmaxRow, (const float* x, float* y, int64_t n, float scale),
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
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckInput(kOp, "x", x));
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckOutput(kOp, "out", out));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  LOOM_CPU_RETURN_IF_ERROR(CheckRows(kOp, x));
  const int64_t c = x.dim(x.rank() - 1), rows = x.numel() / c;
  const float* px = x.data<float>();
  float* po = out->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) internal::SoftmaxRow(px + r * c, po + r * c, c, 1.0f);
  return absl::OkStatus();
}

absl::Status SoftmaxBackward(const Tensor& out, const Tensor& dout, Tensor* dx) {
  constexpr const char* kOp = "SoftmaxBackward";
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckInput(kOp, "out", out));
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckInput(kOp, "dout", dout));
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckOutput(kOp, "dx", dx));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "out", out, "dout", dout));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "out", out, "dx", *dx));
  LOOM_CPU_RETURN_IF_ERROR(CheckRows(kOp, out));
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
