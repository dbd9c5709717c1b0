#include "core/cuda/rmsnorm.h"

#include "core/ops/contracts/shape_checks.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {

absl::Status RmsNormForward(const Tensor& x, const Tensor& gamma, float eps, Tensor* out,
                            Tensor* rstd) {
  constexpr const char* kOp = "RmsNormForward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"x", &x}, {"out", out}}));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckRmsNormRows(kOp, x, gamma, *rstd));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "rows", rows));
  LOOM_RETURN_IF_ERROR(
      internal::CheckDevices(kOp, {{"x", &x}, {"gamma", &gamma}, {"out", out}, {"rstd", rstd}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::RmsNormForward(internal::ElemOf(x.dtype()), x.raw_data(),
                                                gamma.raw_data(), eps, rows, gamma.dim(0),
                                                out->raw_data(), rstd->data<float>(), stream));
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                             const Tensor& rstd, Tensor* dx, Tensor* dgamma) {
  constexpr const char* kOp = "RmsNormBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"x", &x}, {"dout", &dout}, {"dx", dx}}));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "gamma", gamma));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "rstd", rstd, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dgamma", dgamma));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "x", x, "dgamma", *dgamma));
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, ops::CheckRmsNormRows(kOp, x, gamma, rstd));
  LOOM_RETURN_IF_ERROR(ops::CheckNormGradients(kOp, x, gamma, dout, *dx, *dgamma));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "rows", rows));
  LOOM_ASSIGN_OR_RETURN(const int64_t chunks, internal::CheckColumnChunks(kOp, "x", x, rows));
  const int64_t c = gamma.dim(0);
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dout", &dout},
                                                    {"x", &x},
                                                    {"gamma", &gamma},
                                                    {"rstd", &rstd},
                                                    {"dx", dx},
                                                    {"dgamma", dgamma}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  // dgamma partials [chunks, C] (sum of dout x rstd per chunk of rows), before
  // dx, because dx may overwrite dout.
  LOOM_ASSIGN_OR_RETURN(Tensor partials, internal::Scratch(Shape{chunks, c}, DType::kF32));
  const kernels::Elem t = internal::ElemOf(x.dtype());
  LOOM_CUDA_LAUNCH(
      kOp, kernels::ColumnPartials(t, dout.raw_data(), x.raw_data(), nullptr, rstd.data<float>(),
                                   rows, c, nullptr, partials.data<float>(), stream));
  LOOM_CUDA_LAUNCH(
      kOp, kernels::AccumulatePartials(internal::ElemOf(dgamma->dtype()), partials.data<float>(),
                                       chunks, c, dgamma->raw_data(), stream));
  LOOM_CUDA_LAUNCH(kOp,
                   kernels::RmsNormBackwardDx(t, dout.raw_data(), x.raw_data(), gamma.raw_data(),
                                              rstd.data<float>(), rows, c, dx->raw_data(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
