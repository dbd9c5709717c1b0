#include "core/cuda/softmax.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

absl::Status CheckRowsOf(const char* op, const Tensor& x) {
  if (x.rank() < 1 || x.dim(x.rank() - 1) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " needs rank >= 1 and a non-empty last dim"));
  }
  return internal::CheckRows(op, "rows", x.numel() / x.dim(x.rank() - 1));
}

}  // namespace

absl::Status SoftmaxForward(const Tensor& x, Tensor* out) {
  constexpr const char* kOp = "SoftmaxForward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"x", &x}, {"out", out}}));
  LOOM_RETURN_IF_ERROR(CheckRowsOf(kOp, x));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"out", out}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const int64_t c = x.dim(x.rank() - 1);
  LOOM_CUDA_LAUNCH(kOp, kernels::SoftmaxForward(internal::ElemOf(x.dtype()), x.raw_data(),
                                                out->raw_data(), x.numel() / c, c, stream));
  return absl::OkStatus();
}

absl::Status SoftmaxBackward(const Tensor& out, const Tensor& dout, Tensor* dx) {
  constexpr const char* kOp = "SoftmaxBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"out", &out}, {"dout", &dout}, {"dx", dx}}));
  LOOM_RETURN_IF_ERROR(CheckRowsOf(kOp, out));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"out", &out}, {"dout", &dout}, {"dx", dx}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const int64_t c = out.dim(out.rank() - 1);
  LOOM_CUDA_LAUNCH(kOp, kernels::SoftmaxBackward(internal::ElemOf(out.dtype()), out.raw_data(),
                                                 dout.raw_data(), dx->raw_data(), out.numel() / c,
                                                 c, stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
