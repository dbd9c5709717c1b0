#include "core/cuda/layernorm.h"

#include "absl/strings/str_cat.h"
#include "core/cpu/shape_checks.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

using internal::CheckDevices;
using internal::CheckFloat;
using internal::CheckFloatOut;
using internal::CheckSameDType;
using internal::ElemOf;

absl::Status CheckParam(const char* op, const char* name, const Tensor& p, const Tensor& x) {
  return cpu::CheckLastDimVector(op, "x", x, name, p);
}

absl::Status CheckNonEmptyRows(const char* op, const Tensor& x, int64_t c) {
  if (c == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " has an empty last dim"));
  }
  return internal::CheckRows(op, "rows", x.numel() / c);
}

}  // namespace

absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd) {
  constexpr const char* kOp = "LayerNormForward";
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "beta", beta));
  LOOM_RETURN_IF_ERROR(CheckFloatOut(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "mean", mean, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckSameDType(kOp, "x", x, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckSameDType(kOp, "x", x, "beta", beta));
  LOOM_RETURN_IF_ERROR(CheckSameDType(kOp, "x", x, "out", *out));
  LOOM_RETURN_IF_ERROR(CheckParam(kOp, "gamma", gamma, x));
  LOOM_RETURN_IF_ERROR(CheckParam(kOp, "beta", beta, x));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  const int64_t c = gamma.dim(0);
  LOOM_RETURN_IF_ERROR(CheckNonEmptyRows(kOp, x, c));
  const int64_t rows = x.numel() / c;
  LOOM_RETURN_IF_ERROR(internal::CheckNumelIs(kOp, "mean", *mean, rows, "one per row of x"));
  LOOM_RETURN_IF_ERROR(internal::CheckNumelIs(kOp, "rstd", *rstd, rows, "one per row of x"));
  LOOM_RETURN_IF_ERROR(CheckDevices(kOp, {{"x", &x}, {"gamma", &gamma}, {"beta", &beta},
                                          {"out", out}, {"mean", mean}, {"rstd", rstd}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::LayerNormForward(ElemOf(x.dtype()), x.raw_data(), gamma.raw_data(),
                                                  beta.raw_data(), eps, rows, c, out->raw_data(),
                                                  mean->data<float>(), rstd->data<float>(),
                                                  stream));
  return absl::OkStatus();
}

absl::Status LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta) {
  constexpr const char* kOp = "LayerNormBackward";
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "mean", mean, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckFloatOut(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckFloatOut(kOp, "dgamma", dgamma));
  LOOM_RETURN_IF_ERROR(CheckFloatOut(kOp, "dbeta", dbeta));
  LOOM_RETURN_IF_ERROR(CheckSameDType(kOp, "x", x, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckSameDType(kOp, "x", x, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckSameDType(kOp, "x", x, "dx", *dx));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "x", x, "dgamma", *dgamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "x", x, "dbeta", *dbeta));
  LOOM_RETURN_IF_ERROR(CheckParam(kOp, "gamma", gamma, x));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "gamma", gamma, "dgamma", *dgamma));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "gamma", gamma, "dbeta", *dbeta));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "dx", *dx));
  const int64_t c = gamma.dim(0);
  LOOM_RETURN_IF_ERROR(CheckNonEmptyRows(kOp, x, c));
  const int64_t rows = x.numel() / c;
  LOOM_RETURN_IF_ERROR(internal::CheckNumelIs(kOp, "mean", mean, rows, "one per row of x"));
  LOOM_RETURN_IF_ERROR(internal::CheckNumelIs(kOp, "rstd", rstd, rows, "one per row of x"));
  const int64_t chunks = kernels::ColumnChunks(rows);
  if (chunks > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": x ", x.DebugString(), " has ", rows,
                                                   " rows; at most ",
                                                   65535 * kernels::kColumnChunkRows,
                                                   " are supported"));
  }
  LOOM_RETURN_IF_ERROR(CheckDevices(kOp, {{"dout", &dout}, {"x", &x}, {"gamma", &gamma},
                                          {"mean", &mean}, {"rstd", &rstd}, {"dx", dx},
                                          {"dgamma", dgamma}, {"dbeta", dbeta}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  // [dbeta partials | dgamma partials], each [chunks, C]. Computed before dx,
  // because dx may overwrite dout.
  LOOM_ASSIGN_OR_RETURN(Tensor partials, internal::Scratch(Shape{2, chunks, c}, DType::kF32));
  float* pb = partials.data<float>();
  float* pg = pb + chunks * c;
  LOOM_CUDA_LAUNCH(kOp, kernels::ColumnPartials(ElemOf(x.dtype()), dout.raw_data(), x.raw_data(),
                                                mean.data<float>(), rstd.data<float>(), rows, c,
                                                pb, pg, stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::AccumulatePartials(ElemOf(dbeta->dtype()), pb, chunks, c,
                                                    dbeta->raw_data(), stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::AccumulatePartials(ElemOf(dgamma->dtype()), pg, chunks, c,
                                                    dgamma->raw_data(), stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::LayerNormBackwardDx(ElemOf(x.dtype()), dout.raw_data(),
                                                     x.raw_data(), gamma.raw_data(),
                                                     mean.data<float>(), rstd.data<float>(), rows,
                                                     c, dx->raw_data(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
