#include "core/cuda/dropout.h"

#include "absl/strings/str_cat.h"
#include "core/cpu/philox.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

kernels::DropoutParams Params(const cpu::DropoutOptions& opts) {
  kernels::DropoutParams p;
  p.seed = opts.seed;
  p.offset = opts.offset;
  p.threshold = cpu::DropoutThreshold(opts.p);
  p.scale = opts.p >= 1.0f ? 0.0f : 1.0f / (1.0f - opts.p);  // as the CPU
  return p;
}

absl::Status Run(const char* op, const Tensor& in, Tensor* out, uint8_t* mask,
                 const cpu::DropoutOptions& opts, const cpu::GlobalIndex& where) {
  const int64_t c = in.dim(in.rank() - 1);
  if (c == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const int64_t stride = where.row_stride == 0 ? c : where.row_stride;
  LOOM_CUDA_LAUNCH(op, kernels::Dropout(internal::ElemOf(in.dtype()), in.raw_data(),
                                        out->raw_data(), mask, in.numel() / c, c,
                                        where.first_index, stride, Params(opts), stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status DropoutForward(const Tensor& x, Tensor* out, const cpu::DropoutOptions& opts,
                            const cpu::GlobalIndex& where, Tensor* mask) {
  constexpr const char* kOp = "DropoutForward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"x", &x}, {"out", out}}));
  LOOM_RETURN_IF_ERROR(ops::CheckDropoutArgs(kOp, x, opts, where));
  if (mask != nullptr) {
    LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "mask", *mask, DType::kU8));
    LOOM_RETURN_IF_ERROR(
        ops::CheckNumel(kOp, "mask", *mask, x.numel(), "one byte per element of x"));
  }
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"x", &x}, {"out", out}, {"mask", mask}}));
  return Run(kOp, x, out, mask != nullptr ? mask->data<uint8_t>() : nullptr, opts, where);
}

absl::Status DropoutBackward(const Tensor& dout, Tensor* dx, const cpu::DropoutOptions& opts,
                             const cpu::GlobalIndex& where) {
  constexpr const char* kOp = "DropoutBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(kOp, {{"dout", &dout}, {"dx", dx}}));
  LOOM_RETURN_IF_ERROR(ops::CheckDropoutArgs(kOp, dout, opts, where));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"dout", &dout}, {"dx", dx}}));
  return Run(kOp, dout, dx, nullptr, opts, where);
}

}  // namespace loom::core::cuda
