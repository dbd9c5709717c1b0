#include "core/cpu/residual_norm.h"

#include <algorithm>

#include "core/cpu/check.h"
#include "core/cpu/dropout.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/layernorm.h"
#include "core/cpu/rmsnorm.h"
#include "core/ops/contracts/residual_norm_checks.h"

namespace loom::core::cpu {

using internal::CheckInput;
using internal::CheckOutput;

absl::Status ResidualNormForward(const Tensor& x, const Tensor& branch, const Tensor& gamma,
                                 const Tensor& beta, const ResidualNormOptions& o, Tensor* resid,
                                 Tensor* out, Tensor* mean, Tensor* rstd) {
  constexpr const char* kOp = "ResidualNormForward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "branch", branch));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  // Kind mismatches (beta, mean, dbeta given or missing) are the contract's.
  if (beta.defined()) LOOM_RETURN_IF_ERROR(CheckInput(kOp, "beta", beta));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "resid", resid));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "out", out));
  if (mean != nullptr) LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "mean", mean));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "rstd", rstd));
  LOOM_RETURN_IF_ERROR(
      ops::CheckResidualNormForward(kOp, x, branch, gamma, beta, o, resid, out, mean, rstd)
          .status());
  // The unfused path: dropout of the branch in place, then branch + x.
  if (o.dropout.p > 0.0f) {
    // x may be resid's storage: keep it until the add (dropout would overwrite it).
    if (resid->SharesStorageWith(x) && resid->raw_data() == x.raw_data()) {
      LOOM_ASSIGN_OR_RETURN(Tensor dropped, branch.Clone());
      LOOM_RETURN_IF_ERROR(DropoutForward(dropped, &dropped, o.dropout, o.where));
      LOOM_RETURN_IF_ERROR(Add(dropped, x, resid));
    } else {
      LOOM_RETURN_IF_ERROR(DropoutForward(branch, resid, o.dropout, o.where));
      LOOM_RETURN_IF_ERROR(Add(*resid, x, resid));
    }
  } else {
    LOOM_RETURN_IF_ERROR(Add(branch, x, resid));
  }
  if (o.rms) return RmsNormForward(*resid, gamma, o.eps, out, rstd);
  return LayerNormForward(*resid, gamma, beta, o.eps, out, mean, rstd);
}

absl::Status ResidualNormBackward(const Tensor& dout, const Tensor& dresid, const Tensor& resid,
                                  const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                  const ResidualNormOptions& o, Tensor* dx, Tensor* dbranch,
                                  Tensor* dgamma, Tensor* dbeta) {
  constexpr const char* kOp = "ResidualNormBackward";
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "dresid", dresid));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "resid", resid));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "gamma", gamma));
  if (mean.defined()) LOOM_RETURN_IF_ERROR(CheckInput(kOp, "mean", mean));
  LOOM_RETURN_IF_ERROR(CheckInput(kOp, "rstd", rstd));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dx", dx));
  if (dbranch != nullptr) LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dbranch", dbranch));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dgamma", dgamma));
  if (dbeta != nullptr) LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "dbeta", dbeta));
  LOOM_RETURN_IF_ERROR(ops::CheckResidualNormBackward(kOp, dout, dresid, resid, gamma, mean, rstd,
                                                      o, dx, dbranch, dgamma, dbeta)
                           .status());
  // dresid may be dx's storage: the norm's dx must not overwrite it first.
  const bool dresid_is_dx = dresid.raw_data() == dx->raw_data();
  Tensor norm_dx = *dx;
  if (dresid_is_dx) {
    LOOM_ASSIGN_OR_RETURN(norm_dx, Tensor::Empty(dx->shape(), DType::kF32));
  }
  if (o.rms) {
    LOOM_RETURN_IF_ERROR(RmsNormBackward(dout, resid, gamma, rstd, &norm_dx, dgamma));
  } else {
    LOOM_RETURN_IF_ERROR(
        LayerNormBackward(dout, resid, gamma, mean, rstd, &norm_dx, dgamma, dbeta));
  }
  LOOM_RETURN_IF_ERROR(Add(norm_dx, dresid, dx));
  if (dbranch == nullptr) return absl::OkStatus();
  if (o.dropout.p > 0.0f) return DropoutBackward(*dx, dbranch, o.dropout, o.where);
  if (dbranch->raw_data() != dx->raw_data()) {
    std::copy_n(dx->data<float>(), dx->numel(), dbranch->data<float>());
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
