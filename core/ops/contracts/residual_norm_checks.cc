#include "core/ops/contracts/residual_norm_checks.h"

#include "absl/strings/str_cat.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/status_macros.h"

namespace loom::core::ops {
namespace {

absl::Status NotNull(const char* op, const char* arg, const Tensor* t) {
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is null"));
  return absl::OkStatus();
}

// LayerNorm needs beta/mean/dbeta; RMSNorm has none and refuses them, so a
// caller mixing up the two kinds hears about it instead of a norm silently
// ignoring its beta.
absl::Status CheckNormKind(const char* op, const ResidualNormOptions& o, const char* arg,
                           bool given) {
  if (o.rms && given) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " given for RMSNorm (ResidualNormOptions::rms), which has none"));
  }
  if (!o.rms && !given) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": LayerNorm needs ", arg));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CheckStats(const char* op, const Tensor& x, const Tensor& gamma,
                                   const Tensor* mean, const Tensor& rstd,
                                   const ResidualNormOptions& o) {
  LOOM_RETURN_IF_ERROR(CheckNormKind(op, o, "mean", mean != nullptr && mean->defined()));
  if (o.rms) return CheckRmsNormRows(op, x, gamma, rstd);
  return CheckLayerNormRows(op, x, gamma, *mean, rstd);
}

}  // namespace

absl::StatusOr<int64_t> CheckResidualNormForward(const char* op, const Tensor& x,
                                                 const Tensor& branch, const Tensor& gamma,
                                                 const Tensor& beta, const ResidualNormOptions& o,
                                                 const Tensor* resid, const Tensor* out,
                                                 const Tensor* mean, const Tensor* rstd) {
  LOOM_RETURN_IF_ERROR(NotNull(op, "resid", resid));
  LOOM_RETURN_IF_ERROR(NotNull(op, "out", out));
  LOOM_RETURN_IF_ERROR(NotNull(op, "rstd", rstd));
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, "x", x, "branch", branch));
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, "x", x, "resid", *resid));
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, "x", x, "out", *out));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, CheckStats(op, x, gamma, mean, *rstd, o));
  LOOM_RETURN_IF_ERROR(CheckNormKind(op, o, "beta", beta.defined()));
  if (!o.rms) LOOM_RETURN_IF_ERROR(CheckLastDimVector(op, "x", x, "beta", beta));
  LOOM_RETURN_IF_ERROR(CheckDropoutArgs(op, branch, o.dropout, o.where));
  return rows;
}

absl::StatusOr<int64_t> CheckResidualNormBackward(const char* op, const Tensor& dout,
                                                  const Tensor& dresid, const Tensor& resid,
                                                  const Tensor& gamma, const Tensor& mean,
                                                  const Tensor& rstd, const ResidualNormOptions& o,
                                                  const Tensor* dx, const Tensor* dbranch,
                                                  const Tensor* dgamma, const Tensor* dbeta) {
  LOOM_RETURN_IF_ERROR(NotNull(op, "dx", dx));
  LOOM_RETURN_IF_ERROR(NotNull(op, "dgamma", dgamma));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, CheckStats(op, resid, gamma, &mean, rstd, o));
  LOOM_RETURN_IF_ERROR(CheckNormGradients(op, resid, gamma, dout, *dx, *dgamma));
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, "resid", resid, "dresid", dresid));
  if (dbranch != nullptr) {
    LOOM_RETURN_IF_ERROR(CheckSameShape(op, "resid", resid, "dbranch", *dbranch));
  }
  LOOM_RETURN_IF_ERROR(CheckNormKind(op, o, "dbeta", dbeta != nullptr));
  if (dbeta != nullptr) LOOM_RETURN_IF_ERROR(CheckSameShape(op, "gamma", gamma, "dbeta", *dbeta));
  LOOM_RETURN_IF_ERROR(CheckDropoutArgs(op, resid, o.dropout, o.where));
  return rows;
}

}  // namespace loom::core::ops
