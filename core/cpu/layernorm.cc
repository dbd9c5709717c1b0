#include "core/cpu/layernorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckNumel;
using internal::CheckOutput;

absl::Status CheckParam(const char* op, const char* name, const Tensor& p, const Tensor& x) {
  LOOM_CPU_RETURN_IF_ERROR(CheckRank(op, name, p, 1));
  if (x.rank() < 1 || p.dim(0) != x.dim(x.rank() - 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " and ", name, " ", p.DebugString(),
                     ": last dim of x must equal the ", name, " length"));
  }
  return absl::OkStatus();
}

LOOM_CPU_INLINE void LayerNormRowBody(const float* xr, const float* pg, const float* pb, int64_t c,
                                      float eps, float* orow, float* mean, float* rstd) {
  const float inv_c = 1.0f / static_cast<float>(c);
  const float m = internal::SumOf(c, [&](int64_t j) { return xr[j]; }) * inv_c;
  const float var = internal::SumOf(c, [&](int64_t j) {
    const float d = xr[j] - m;
    return d * d;
  });
  const float s = 1.0f / std::sqrt(var * inv_c + eps);
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) orow[j] = (xr[j] - m) * s * pg[j] + pb[j];
  *mean = m;
  *rstd = s;
}
LOOM_CPU_MULTIVERSION(LayerNormRow,
                      (const float* xr, const float* pg, const float* pb, int64_t c, float eps,
                       float* orow, float* mean, float* rstd),
                      (xr, pg, pb, c, eps, orow, mean, rstd))

// dnorm = gamma * dout; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm));
// dg += norm * dout; db += dout.
LOOM_CPU_INLINE void LayerNormBackwardRowBody(const float* dor, const float* xr, const float* pg,
                                              int64_t c, float m, float s, float* dxr, float* dg,
                                              float* db) {
  const float inv_c = 1.0f / static_cast<float>(c);
  const float sum_dn = internal::SumOf(c, [&](int64_t j) { return pg[j] * dor[j]; });
  const float sum_dn_n =
      internal::SumOf(c, [&](int64_t j) { return pg[j] * dor[j] * ((xr[j] - m) * s); });
  const float mean_dn = sum_dn * inv_c, mean_dn_n = sum_dn_n * inv_c;
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    const float n = (xr[j] - m) * s;
    dg[j] += n * dor[j];
    db[j] += dor[j];
    dxr[j] = s * (pg[j] * dor[j] - mean_dn - n * mean_dn_n);
  }
}
LOOM_CPU_MULTIVERSION(LayerNormBackwardRow,
                      (const float* dor, const float* xr, const float* pg, int64_t c, float m,
                       float s, float* dxr, float* dg, float* db),
                      (dor, xr, pg, c, m, s, dxr, dg, db))

}  // namespace

absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd) {
  constexpr const char* kOp = "LayerNormForward";
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "beta", beta));
  LOOM_CPU_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_CPU_RETURN_IF_ERROR(CheckOutput(kOp, "mean", mean));
  LOOM_CPU_RETURN_IF_ERROR(CheckOutput(kOp, "rstd", rstd));
  LOOM_CPU_RETURN_IF_ERROR(CheckParam(kOp, "gamma", gamma, x));
  LOOM_CPU_RETURN_IF_ERROR(CheckParam(kOp, "beta", beta, x));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  const int64_t c = gamma.dim(0);
  if (c == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": x ", x.DebugString(), " has an empty last dim"));
  }
  const int64_t rows = x.numel() / c;
  LOOM_CPU_RETURN_IF_ERROR(CheckNumel(kOp, "mean", *mean, rows, "one per row of x"));
  LOOM_CPU_RETURN_IF_ERROR(CheckNumel(kOp, "rstd", *rstd, rows, "one per row of x"));
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  const float* pb = beta.data<float>();
  float* po = out->data<float>();
  float* pm = mean->data<float>();
  float* pr = rstd->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    LayerNormRow(px + r * c, pg, pb, c, eps, po + r * c, pm + r, pr + r);
  }
  return absl::OkStatus();
}

absl::Status LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta) {
  constexpr const char* kOp = "LayerNormBackward";
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "dout", dout));
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "mean", mean));
  LOOM_CPU_RETURN_IF_ERROR(CheckInput(kOp, "rstd", rstd));
  LOOM_CPU_RETURN_IF_ERROR(CheckOutput(kOp, "dx", dx));
  LOOM_CPU_RETURN_IF_ERROR(CheckOutput(kOp, "dgamma", dgamma));
  LOOM_CPU_RETURN_IF_ERROR(CheckOutput(kOp, "dbeta", dbeta));
  LOOM_CPU_RETURN_IF_ERROR(CheckParam(kOp, "gamma", gamma, x));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "gamma", gamma, "dgamma", *dgamma));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "gamma", gamma, "dbeta", *dbeta));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "dout", dout));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "dx", *dx));
  const int64_t c = gamma.dim(0);
  if (c == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": x ", x.DebugString(), " has an empty last dim"));
  }
  const int64_t rows = x.numel() / c;
  LOOM_CPU_RETURN_IF_ERROR(CheckNumel(kOp, "mean", mean, rows, "one per row of x"));
  LOOM_CPU_RETURN_IF_ERROR(CheckNumel(kOp, "rstd", rstd, rows, "one per row of x"));
  const float* pdo = dout.data<float>();
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx->data<float>();
  const int nthreads = omp_get_max_threads();
  // Per-thread [dgamma | dbeta] partial rows, added in thread order at the end.
  std::vector<float> partial(static_cast<size_t>(nthreads) * 2 * c, 0.0f);
#pragma omp parallel num_threads(nthreads)
  {
    float* dg = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * c;
    float* db = dg + c;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      LayerNormBackwardRow(pdo + r * c, px + r * c, pg, c, pm[r], pr[r], pdx + r * c, dg, db);
    }
  }
  float* pdg = dgamma->data<float>();
  float* pdb = dbeta->data<float>();
  for (int t = 0; t < nthreads; ++t) {
    const float* dg = partial.data() + static_cast<size_t>(t) * 2 * c;
    for (int64_t j = 0; j < c; ++j) {
      pdg[j] += dg[j];
      pdb[j] += dg[c + j];
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
