#include "core/cpu/layernorm.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/check.h"
#include "core/cpu/parallel.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;

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
// AVX-512: two passes over the L1-resident row for mean and variance (4
// vector accumulators each), then out = (x s - m s) g + b.
LOOM_CPU_V4 __attribute__((noinline)) void LayerNormRowV4(const float* xr, const float* pg,
                                                          const float* pb, int64_t c, float eps,
                                                          float* orow, float* mean, float* rstd) {
  using internal::TailMask;
  const float inv_c = 1.0f / static_cast<float>(c);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 64 <= c; j += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(xr + j));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(xr + j + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(xr + j + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(xr + j + 48));
  }
  for (; j < c; j += 16) {
    a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(TailMask(std::min<int64_t>(16, c - j)), xr + j));
  }
  const float m =
      _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) * inv_c;
  const __m512 vm = _mm512_set1_ps(m);
  a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  j = 0;
  for (; j + 64 <= c; j += 64) {
    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(xr + j), vm);
    const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(xr + j + 16), vm);
    const __m512 d2 = _mm512_sub_ps(_mm512_loadu_ps(xr + j + 32), vm);
    const __m512 d3 = _mm512_sub_ps(_mm512_loadu_ps(xr + j + 48), vm);
    a0 = _mm512_fmadd_ps(d0, d0, a0);
    a1 = _mm512_fmadd_ps(d1, d1, a1);
    a2 = _mm512_fmadd_ps(d2, d2, a2);
    a3 = _mm512_fmadd_ps(d3, d3, a3);
  }
  for (; j < c; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, c - j));
    const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, xr + j), vm);
    a0 = _mm512_fmadd_ps(d, d, a0);
  }
  const float var = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  const float s = 1.0f / std::sqrt(var * inv_c + eps);
  const __m512 vs = _mm512_set1_ps(s), vms = _mm512_set1_ps(m * s);
  j = 0;
  for (; j + 32 <= c; j += 32) {
    const __m512 n0 = _mm512_fmsub_ps(_mm512_loadu_ps(xr + j), vs, vms);
    const __m512 n1 = _mm512_fmsub_ps(_mm512_loadu_ps(xr + j + 16), vs, vms);
    _mm512_storeu_ps(orow + j, _mm512_fmadd_ps(n0, _mm512_loadu_ps(pg + j), _mm512_loadu_ps(pb + j)));
    _mm512_storeu_ps(orow + j + 16, _mm512_fmadd_ps(n1, _mm512_loadu_ps(pg + j + 16),
                                                    _mm512_loadu_ps(pb + j + 16)));
  }
  for (; j < c; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, c - j));
    const __m512 n0 = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, xr + j), vs, vms);
    _mm512_mask_storeu_ps(orow + j, k, _mm512_fmadd_ps(n0, _mm512_maskz_loadu_ps(k, pg + j),
                                                       _mm512_maskz_loadu_ps(k, pb + j)));
  }
  *mean = m;
  *rstd = s;
}
LOOM_CPU_DISPATCH_V4(LayerNormRow,
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
// AVX-512: both row sums in one pass (n = x s - m s); returns mean(dnorm)
// and mean(dnorm * norm).
LOOM_CPU_V4 LOOM_CPU_INLINE void LayerNormBackwardSumsV4(const float* dor, const float* xr,
                                                        const float* pg, int64_t c, float m,
                                                        float s, __m512* mean_dn,
                                                        __m512* mean_dn_n) {
  using internal::TailMask;
  const float inv_c = 1.0f / static_cast<float>(c);
  const __m512 vs = _mm512_set1_ps(s), vms = _mm512_set1_ps(m * s);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  int64_t j = 0;
  for (; j + 32 <= c; j += 32) {
    const __m512 dn0 = _mm512_mul_ps(_mm512_loadu_ps(pg + j), _mm512_loadu_ps(dor + j));
    const __m512 dn1 = _mm512_mul_ps(_mm512_loadu_ps(pg + j + 16), _mm512_loadu_ps(dor + j + 16));
    const __m512 n0 = _mm512_fmsub_ps(_mm512_loadu_ps(xr + j), vs, vms);
    const __m512 n1 = _mm512_fmsub_ps(_mm512_loadu_ps(xr + j + 16), vs, vms);
    a0 = _mm512_add_ps(a0, dn0);
    a1 = _mm512_add_ps(a1, dn1);
    b0 = _mm512_fmadd_ps(dn0, n0, b0);
    b1 = _mm512_fmadd_ps(dn1, n1, b1);
  }
  for (; j < c; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, c - j));
    const __m512 dn =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(k, pg + j), _mm512_maskz_loadu_ps(k, dor + j));
    const __m512 n0 = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, xr + j), vs, vms);
    a0 = _mm512_add_ps(a0, dn);
    b0 = _mm512_fmadd_ps(dn, n0, b0);
  }
  *mean_dn = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) * inv_c);
  *mean_dn_n = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(b0, b1)) * inv_c);
}

// dgamma/dbeta are updated in the same pass as dx (a tried 2-row variant that
// loads/stores them once per row pair measured slower).
LOOM_CPU_V4 __attribute__((noinline)) void LayerNormBackwardRowV4(const float* dor,
                                                                  const float* xr,
                                                                  const float* pg, int64_t c,
                                                                  float m, float s, float* dxr,
                                                                  float* dg, float* db) {
  using internal::TailMask;
  __m512 mdn0, mdnn0;
  LayerNormBackwardSumsV4(dor, xr, pg, c, m, s, &mdn0, &mdnn0);
  const __m512 vs0 = _mm512_set1_ps(s), vms0 = _mm512_set1_ps(m * s);
  for (int64_t j = 0; j < c; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, c - j));
    const __m512 d = _mm512_maskz_loadu_ps(k, dor + j);
    const __m512 n0 = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, xr + j), vs0, vms0);
    _mm512_mask_storeu_ps(dg + j, k, _mm512_fmadd_ps(n0, d, _mm512_maskz_loadu_ps(k, dg + j)));
    _mm512_mask_storeu_ps(db + j, k, _mm512_add_ps(d, _mm512_maskz_loadu_ps(k, db + j)));
    const __m512 t = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, pg + j), d, mdn0);
    _mm512_mask_storeu_ps(dxr + j, k, _mm512_mul_ps(vs0, _mm512_fnmadd_ps(n0, mdnn0, t)));
  }
}
// AVX-512, kRows rows at once: the row sums first, then one column pass that
// loads gamma and the dgamma/dbeta partials once per column vector for all
// kRows rows (dg/db still get the rows added in row order: same bits as the
// per-row version).
template <int kRows>
LOOM_CPU_V4 LOOM_CPU_INLINE void LayerNormBackwardRowsV4Impl(const float* dor, const float* xr,
                                                            const float* pg, int64_t c,
                                                            const float* m, const float* s,
                                                            float* dxr, float* dg, float* db) {
  using internal::TailMask;
  __m512 mdn[kRows], mdnn[kRows], vs[kRows], vms[kRows];
  for (int i = 0; i < kRows; ++i) {
    LayerNormBackwardSumsV4(dor + i * c, xr + i * c, pg, c, m[i], s[i], &mdn[i], &mdnn[i]);
    vs[i] = _mm512_set1_ps(s[i]);
    vms[i] = _mm512_set1_ps(m[i] * s[i]);
  }
  for (int64_t j = 0; j < c; j += 16) {
    const __mmask16 k = TailMask(std::min<int64_t>(16, c - j));
    const __m512 g = _mm512_maskz_loadu_ps(k, pg + j);
    __m512 vdg = _mm512_maskz_loadu_ps(k, dg + j), vdb = _mm512_maskz_loadu_ps(k, db + j);
    for (int i = 0; i < kRows; ++i) {
      const __m512 d = _mm512_maskz_loadu_ps(k, dor + i * c + j);
      const __m512 n0 = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, xr + i * c + j), vs[i], vms[i]);
      vdg = _mm512_fmadd_ps(n0, d, vdg);
      vdb = _mm512_add_ps(d, vdb);
      const __m512 t = _mm512_fmsub_ps(g, d, mdn[i]);
      _mm512_mask_storeu_ps(dxr + i * c + j, k, _mm512_mul_ps(vs[i], _mm512_fnmadd_ps(n0, mdnn[i], t)));
    }
    _mm512_mask_storeu_ps(dg + j, k, vdg);
    _mm512_mask_storeu_ps(db + j, k, vdb);
  }
}
LOOM_CPU_V4 __attribute__((noinline)) void LayerNormBackwardRows4V4(
    const float* dor, const float* xr, const float* pg, int64_t c, const float* m, const float* s,
    float* dxr, float* dg, float* db) {
  LayerNormBackwardRowsV4Impl<4>(dor, xr, pg, c, m, s, dxr, dg, db);
}

LOOM_CPU_DISPATCH_V4(LayerNormBackwardRow,
                     (const float* dor, const float* xr, const float* pg, int64_t c, float m,
                      float s, float* dxr, float* dg, float* db),
                     (dor, xr, pg, c, m, s, dxr, dg, db))


}  // namespace

absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd) {
  constexpr const char* kOp = "LayerNormForward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "beta", beta));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "mean", mean));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "rstd", rstd));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckLayerNormRows(kOp, x, gamma, *mean, *rstd));
  LOOM_RETURN_IF_ERROR(ops::CheckLastDimVector(kOp, "x", x, "beta", beta));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  const int64_t c = gamma.dim(0);
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
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "mean", mean));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "rstd", rstd));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dgamma", dgamma));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dbeta", dbeta));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckLayerNormRows(kOp, x, gamma, mean, rstd));
  LOOM_RETURN_IF_ERROR(ops::CheckNormGradients(kOp, x, gamma, dout, *dx, *dgamma));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "gamma", gamma, "dbeta", *dbeta));
  const int64_t c = gamma.dim(0);
  const float* pdo = dout.data<float>();
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx->data<float>();
  const bool avx512 = internal::UseAvx512();
  // Each thread's contiguous run of rows, its [dgamma | dbeta] partials added
  // in thread order at the end.
  internal::ParallelRowRunsAccumulate(
      rows, c, {dgamma->data<float>(), dbeta->data<float>()},
      [&](int64_t lo, int64_t hi, float* dg) {
        float* db = dg + c;
        int64_t r = lo;
        if (avx512) {  // blocks of 4 rows
          for (; r + 4 <= hi; r += 4) {
            LayerNormBackwardRows4V4(pdo + r * c, px + r * c, pg, c, pm + r, pr + r, pdx + r * c,
                                     dg, db);
          }
        }
        for (; r < hi; ++r) {
          LayerNormBackwardRow(pdo + r * c, px + r * c, pg, c, pm[r], pr[r], pdx + r * c, dg, db);
        }
      });
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
