#include "core/cpu/rmsnorm.h"

#include <cmath>

#include "core/cpu/check.h"
#include "core/cpu/parallel.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;

// One row: the sum of squares with SumOf's independent partial sums, then
// out = (x s) g.
LOOM_CPU_INLINE void RmsNormRowBody(const float* xr, const float* pg, int64_t c, float eps,
                                    float* orow, float* rstd) {
  const float sum_sq = internal::SumOf(c, [&](int64_t j) { return xr[j] * xr[j]; });
  const float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(c) + eps);
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) orow[j] = xr[j] * s * pg[j];
  *rstd = s;
}
LOOM_CPU_MULTIVERSION(RmsNormRow,
                      (const float* xr, const float* pg, int64_t c, float eps, float* orow,
                       float* rstd),
                      (xr, pg, c, eps, orow, rstd))

// One row of the backward; dg is the thread's partial dgamma. dxr may be dor:
// every dor[j] is read before dxr[j] is written.
LOOM_CPU_INLINE void RmsNormBackwardRowBody(const float* dor, const float* xr, const float* pg,
                                            int64_t c, float s, float* dxr, float* dg) {
  const float mean_dn_n =
      internal::SumOf(c, [&](int64_t j) { return pg[j] * dor[j] * (xr[j] * s); }) /
      static_cast<float>(c);
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    const float n = xr[j] * s, d = dor[j];
    dg[j] += n * d;
    dxr[j] = s * (pg[j] * d - n * mean_dn_n);
  }
}
LOOM_CPU_MULTIVERSION(RmsNormBackwardRow,
                      (const float* dor, const float* xr, const float* pg, int64_t c, float s,
                       float* dxr, float* dg),
                      (dor, xr, pg, c, s, dxr, dg))

}  // namespace

absl::Status RmsNormForward(const Tensor& x, const Tensor& gamma, float eps, Tensor* out,
                            Tensor* rstd) {
  constexpr const char* kOp = "RmsNormForward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "rstd", rstd));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckRmsNormRows(kOp, x, gamma, *rstd));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  const int64_t c = gamma.dim(0);
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  float* po = out->data<float>();
  float* pr = rstd->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) RmsNormRow(px + r * c, pg, c, eps, po + r * c, pr + r);
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                             const Tensor& rstd, Tensor* dx, Tensor* dgamma) {
  constexpr const char* kOp = "RmsNormBackward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "rstd", rstd));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dgamma", dgamma));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckRmsNormRows(kOp, x, gamma, rstd));
  LOOM_RETURN_IF_ERROR(ops::CheckNormGradients(kOp, x, gamma, dout, *dx, *dgamma));
  const int64_t c = gamma.dim(0);
  const float* pdo = dout.data<float>();
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx->data<float>();
  internal::ParallelRowRunsAccumulate(
      rows, c, {dgamma->data<float>()}, [&](int64_t lo, int64_t hi, float* dg) {
        for (int64_t r = lo; r < hi; ++r) {
          RmsNormBackwardRow(pdo + r * c, px + r * c, pg, c, pr[r], pdx + r * c, dg);
        }
      });
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
