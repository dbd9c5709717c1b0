#include "core/cuda/elementwise.h"

#include "core/ops/contracts/shape_checks.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {

absl::Status BiasAddForward(const Tensor& x, const Tensor& bias, Tensor* out) {
  constexpr const char* kOp = "BiasAddForward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "bias", bias));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "bias", bias));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "out", *out));
  LOOM_RETURN_IF_ERROR(ops::CheckLastDimVector(kOp, "x", x, "bias", bias));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"bias", &bias}, {"out", out}}));
  const int64_t c = bias.dim(0);
  if (c == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::BiasAdd(internal::ElemOf(x.dtype()), x.raw_data(), bias.raw_data(),
                                         out->raw_data(), x.numel() / c, c, stream));
  return absl::OkStatus();
}

absl::Status BiasAddBackward(const Tensor& dout, Tensor* dbias) {
  constexpr const char* kOp = "BiasAddBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dbias", dbias));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kOp, "dout", dout, "dbias", *dbias));
  LOOM_RETURN_IF_ERROR(ops::CheckLastDimVector(kOp, "dout", dout, "bias", *dbias));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dout", &dout}, {"dbias", dbias}}));
  const int64_t c = dbias->dim(0);
  if (c == 0) return absl::OkStatus();
  const int64_t rows = dout.numel() / c;
  LOOM_ASSIGN_OR_RETURN(const int64_t chunks, internal::CheckColumnChunks(kOp, "dout", dout, rows));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_ASSIGN_OR_RETURN(Tensor partials, internal::Scratch(Shape{chunks, c}, DType::kF32));
  LOOM_CUDA_LAUNCH(kOp, kernels::ColumnPartials(internal::ElemOf(dout.dtype()), dout.raw_data(),
                                                nullptr, nullptr, nullptr, rows, c,
                                                partials.data<float>(), nullptr, stream));
  LOOM_CUDA_LAUNCH(
      kOp, kernels::AccumulatePartials(internal::ElemOf(dbias->dtype()), partials.data<float>(),
                                       chunks, c, dbias->raw_data(), stream));
  return absl::OkStatus();
}

absl::Status GeluForward(const Tensor& x, Tensor* out) {
  constexpr const char* kOp = "GeluForward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"x", &x}, {"out", out}}));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"out", out}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::Gelu(internal::ElemOf(x.dtype()), x.raw_data(), out->raw_data(),
                                      x.numel(), stream));
  return absl::OkStatus();
}

absl::Status GeluBackward(const Tensor& x, const Tensor& dout, Tensor* dx) {
  constexpr const char* kOp = "GeluBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"x", &x}, {"dout", &dout}, {"dx", dx}}));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"dout", &dout}, {"dx", dx}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::GeluGrad(internal::ElemOf(x.dtype()), x.raw_data(),
                                          dout.raw_data(), dx->raw_data(), x.numel(), stream));
  return absl::OkStatus();
}

absl::Status Add(const Tensor& a, const Tensor& b, Tensor* out) {
  constexpr const char* kOp = "Add";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"a", &a}, {"b", &b}, {"out", out}}));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"a", &a}, {"b", &b}, {"out", out}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::Add(internal::ElemOf(a.dtype()), a.raw_data(), b.raw_data(),
                                     out->raw_data(), a.numel(), stream));
  return absl::OkStatus();
}

absl::Status Scale(float scale, Tensor* x) {
  constexpr const char* kOp = "Scale";
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", x}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(
      kOp, kernels::Scale(internal::ElemOf(x->dtype()), scale, x->raw_data(), x->numel(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
