#include "core/cuda/layernorm.h"

#include "core/ops/contracts/shape_checks.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {

absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd) {
  constexpr const char* kOp = "LayerNormForward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "beta", beta));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "mean", mean, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "beta", beta));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "out", *out));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckLayerNormRows(kOp, x, gamma, *mean, *rstd));
  LOOM_RETURN_IF_ERROR(ops::CheckLastDimVector(kOp, "x", x, "beta", beta));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "rows", rows));
  const int64_t c = gamma.dim(0);
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"gamma", &gamma}, {"beta", &beta},
                                                    {"out", out}, {"mean", mean}, {"rstd", rstd}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::LayerNormForward(internal::ElemOf(x.dtype()), x.raw_data(),
                                                  gamma.raw_data(), beta.raw_data(), eps, rows, c,
                                                  out->raw_data(), mean->data<float>(),
                                                  rstd->data<float>(), stream));
  return absl::OkStatus();
}

absl::Status LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta) {
  constexpr const char* kOp = "LayerNormBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "mean", mean, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dgamma", dgamma));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dbeta", dbeta));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "dx", *dx));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "x", x, "dgamma", *dgamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "x", x, "dbeta", *dbeta));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckLayerNormRows(kOp, x, gamma, mean, rstd));
  LOOM_RETURN_IF_ERROR(ops::CheckNormGradients(kOp, x, gamma, dout, *dx, *dgamma));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "gamma", gamma, "dbeta", *dbeta));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "rows", rows));
  LOOM_ASSIGN_OR_RETURN(const int64_t chunks, internal::CheckColumnChunks(kOp, "x", x, rows));
  const int64_t c = gamma.dim(0);
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dout", &dout}, {"x", &x}, {"gamma", &gamma},
                                                    {"mean", &mean}, {"rstd", &rstd}, {"dx", dx},
                                                    {"dgamma", dgamma}, {"dbeta", dbeta}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  // [dbeta partials | dgamma partials], each [chunks, C]. Computed before dx,
  // because dx may overwrite dout.
  LOOM_ASSIGN_OR_RETURN(Tensor partials, internal::Scratch(Shape{2, chunks, c}, DType::kF32));
  float* pb = partials.data<float>();
  float* pg = pb + chunks * c;
  LOOM_CUDA_LAUNCH(kOp, kernels::ColumnPartials(internal::ElemOf(x.dtype()), dout.raw_data(),
                                                x.raw_data(), mean.data<float>(),
                                                rstd.data<float>(), rows, c, pb, pg, stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::AccumulatePartials(internal::ElemOf(dbeta->dtype()), pb, chunks,
                                                    c, dbeta->raw_data(), stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::AccumulatePartials(internal::ElemOf(dgamma->dtype()), pg, chunks,
                                                    c, dgamma->raw_data(), stream));
  LOOM_CUDA_LAUNCH(kOp, kernels::LayerNormBackwardDx(internal::ElemOf(x.dtype()), dout.raw_data(),
                                                     x.raw_data(), gamma.raw_data(),
                                                     mean.data<float>(), rstd.data<float>(), rows,
                                                     c, dx->raw_data(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
