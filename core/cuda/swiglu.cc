#include "core/cuda/swiglu.h"

#include "core/ops/contracts/shape_checks.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {

absl::Status SwigluForward(const Tensor& x, Tensor* out) {
  constexpr const char* kOp = "SwigluForward";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "out", *out));
  LOOM_ASSIGN_OR_RETURN(const ops::SwigluDims dims, ops::CheckSwigluHalves(kOp, x, "out", *out));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"out", out}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::SwigluForward(internal::ElemOf(x.dtype()), x.raw_data(), dims.rows,
                                               dims.f, out->raw_data(), stream));
  return absl::OkStatus();
}

absl::Status SwigluBackward(const Tensor& dout, const Tensor& x, Tensor* dx) {
  constexpr const char* kOp = "SwigluBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"x", &x}, {"dx", dx}}));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "x", x, "dout", dout));
  LOOM_ASSIGN_OR_RETURN(const ops::SwigluDims dims, ops::CheckSwigluHalves(kOp, x, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dout", &dout}, {"x", &x}, {"dx", dx}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(
      kOp, kernels::SwigluBackward(internal::ElemOf(x.dtype()), dout.raw_data(), x.raw_data(),
                                   dims.rows, dims.f, dx->raw_data(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
