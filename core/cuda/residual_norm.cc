#include "core/cuda/residual_norm.h"

#include "core/cpu/philox.h"
#include "core/cuda/check_args.h"
#include "core/cuda/residual_norm_kernels.h"
#include "core/ops/contracts/residual_norm_checks.h"

namespace loom::core::cuda {
namespace {

kernels::ResidualNormParams Params(const ops::ResidualNormOptions& o, int64_t rows, int64_t c) {
  kernels::ResidualNormParams p;
  p.rows = rows;
  p.c = c;
  p.eps = o.eps;
  p.rms = o.rms;
  p.dropout = o.dropout.p > 0.0f;  // p = 0: no dropout, as the unfused path
  p.seed = o.dropout.seed;
  p.offset = o.dropout.offset;
  p.threshold = cpu::DropoutThreshold(o.dropout.p);
  p.scale = o.dropout.p >= 1.0f ? 0.0f : 1.0f / (1.0f - o.dropout.p);  // as DropoutForward
  p.first = o.where.first_index;
  p.stride = o.where.row_stride == 0 ? c : o.where.row_stride;
  return p;
}

}  // namespace

absl::Status ResidualNormForward(const Tensor& x, const Tensor& branch, const Tensor& gamma,
                                 const Tensor& beta, const ops::ResidualNormOptions& o,
                                 Tensor* resid, Tensor* out, Tensor* mean, Tensor* rstd) {
  constexpr const char* kOp = "ResidualNormForward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(
      kOp, {{"x", &x}, {"branch", &branch}, {"resid", resid}, {"out", out}}));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "gamma", gamma));
  // Kind mismatches (beta, mean, dbeta given or missing) are the contract's.
  if (beta.defined()) {
    LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "beta", beta));
    LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "beta", beta));
  }
  if (mean != nullptr) LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "mean", mean, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckResidualNormForward(
                                                kOp, x, branch, gamma, beta, o, resid, out,
                                                mean, rstd));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "rows", rows));
  const Tensor* beta_arg = o.rms ? nullptr : &beta;
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x},
                                                    {"branch", &branch},
                                                    {"gamma", &gamma},
                                                    {"beta", beta_arg},
                                                    {"resid", resid},
                                                    {"out", out},
                                                    {"mean", o.rms ? nullptr : mean},
                                                    {"rstd", rstd}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::ResidualNormForward(
                            internal::ElemOf(x.dtype()), x.raw_data(), branch.raw_data(),
                            gamma.raw_data(), o.rms ? nullptr : beta.raw_data(), resid->raw_data(),
                            out->raw_data(), o.rms ? nullptr : mean->data<float>(),
                            rstd->data<float>(), Params(o, rows, gamma.dim(0)), stream));
  return absl::OkStatus();
}

absl::Status ResidualNormBackward(const Tensor& dout, const Tensor& dresid, const Tensor& resid,
                                  const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                  const ops::ResidualNormOptions& o, Tensor* dx, Tensor* dbranch,
                                  Tensor* dgamma, Tensor* dbeta) {
  constexpr const char* kOp = "ResidualNormBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(
      kOp, {{"resid", &resid}, {"dout", &dout}, {"dresid", &dresid}, {"dx", dx}}));
  if (dbranch != nullptr) {
    LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"resid", &resid}, {"dbranch", dbranch}}));
  }
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "resid", resid, "gamma", gamma));
  if (mean.defined()) LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "mean", mean, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dgamma", dgamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "resid", resid, "dgamma", *dgamma));
  if (dbeta != nullptr) {
    LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dbeta", dbeta));
    LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "resid", resid, "dbeta", *dbeta));
  }
  LOOM_ASSIGN_OR_RETURN(const int64_t rows,
                        ops::CheckResidualNormBackward(kOp, dout, dresid, resid, gamma, mean, rstd,
                                                       o, dx, dbranch, dgamma, dbeta));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "rows", rows));
  LOOM_ASSIGN_OR_RETURN(const int64_t chunks,
                        internal::CheckColumnChunks(kOp, "resid", resid, rows));
  const int64_t c = gamma.dim(0);
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dout", &dout},
                                                    {"dresid", &dresid},
                                                    {"resid", &resid},
                                                    {"gamma", &gamma},
                                                    {"mean", o.rms ? nullptr : &mean},
                                                    {"rstd", &rstd},
                                                    {"dx", dx},
                                                    {"dbranch", dbranch},
                                                    {"dgamma", dgamma},
                                                    {"dbeta", o.rms ? nullptr : dbeta}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const kernels::Elem t = internal::ElemOf(resid.dtype());
  const float* pm = o.rms ? nullptr : mean.data<float>();
  // The parameter gradients first, as LayerNorm/RmsNormBackward do (dx may
  // overwrite dout): [dbeta partials | dgamma partials], each [chunks, C].
  LOOM_ASSIGN_OR_RETURN(Tensor partials, internal::Scratch(Shape{2, chunks, c}, DType::kF32));
  float* pb = partials.data<float>();
  float* pg = pb + chunks * c;
  LOOM_CUDA_LAUNCH(kOp, kernels::ColumnPartials(t, dout.raw_data(), resid.raw_data(), pm,
                                                rstd.data<float>(), rows, c,
                                                o.rms ? nullptr : pb, pg, stream));
  if (!o.rms) {
    LOOM_CUDA_LAUNCH(kOp, kernels::AccumulatePartials(internal::ElemOf(dbeta->dtype()), pb,
                                                      chunks, c, dbeta->raw_data(), stream));
  }
  LOOM_CUDA_LAUNCH(kOp, kernels::AccumulatePartials(internal::ElemOf(dgamma->dtype()), pg, chunks,
                                                    c, dgamma->raw_data(), stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::ResidualNormBackwardDx(
                            t, dout.raw_data(), dresid.raw_data(), resid.raw_data(),
                            gamma.raw_data(), pm, rstd.data<float>(), dx->raw_data(),
                            dbranch != nullptr ? dbranch->raw_data() : nullptr,
                            Params(o, rows, c), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
