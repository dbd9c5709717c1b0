#include "core/cuda/convert.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/check.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {

absl::Status Convert(const Tensor& src, Tensor* dst) {
  constexpr const char* kOp = "Convert";
  if (!src.defined()) return absl::InvalidArgumentError("Convert: src is undefined");
  if (dst == nullptr || !dst->defined()) {
    return absl::InvalidArgumentError(
        "Convert: dst is null or undefined (the caller allocates it)");
  }
  if (src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": src ", src.DebugString(), " and dst ",
                                                   dst->DebugString(),
                                                   " have different element counts"));
  }
  const DType from = src.dtype(), to = dst->dtype();
  const bool supported = from == to || (from == DType::kF32 && to == DType::kBF16) ||
                         (from == DType::kBF16 && to == DType::kF32) ||
                         (from == DType::kF32 && to == DType::kF16) ||
                         (from == DType::kF16 && to == DType::kF32);
  if (!supported) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": no conversion from ", src.DebugString(),
                                                   " to ", dst->DebugString(),
                                                   " (supported: f32<->bf16, f32<->f16)"));
  }
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"src", &src}, {"dst", dst}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  if (from == to) {
    if (src.nbytes() > 0 && src.raw_data() != dst->raw_data()) {
      LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->raw_data(), src.raw_data(), src.nbytes(),
                                                cudaMemcpyDeviceToDevice, stream));
    }
    return absl::OkStatus();
  }
  LOOM_CUDA_LAUNCH(kOp, kernels::Convert(internal::ElemOf(from), internal::ElemOf(to),
                                         src.raw_data(), dst->raw_data(), src.numel(), stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
