#include "core/cuda/rope.h"

#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

// Rotates every head of x by `sign` * theta (forward +1, backward -1).
absl::Status Rope(const char* op, const char* x_name, const Tensor& x, const char* out_name,
                  const cpu::RopeOptions& o, float sign, Tensor* out) {
  LOOM_RETURN_IF_ERROR(internal::CheckAlike(op, {{x_name, &x}, {out_name, out}}));
  LOOM_ASSIGN_OR_RETURN(const int64_t r, cpu::CheckRopeArgs(op, x_name, x, o));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(op, {{x_name, &x}, {out_name, out}}));
  const int64_t seq = x.dim(0), heads = x.dim(1) * x.dim(2);
  if (x.numel() == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  // [cos | sin], each [S, r/2].
  LOOM_ASSIGN_OR_RETURN(Tensor table, internal::Scratch(Shape{2, seq, r / 2}, DType::kF32));
  float* cos = table.data<float>();
  float* sin = cos + seq * (r / 2);
  LOOM_CUDA_LAUNCH(op,
                   kernels::RopeTable(o.base, r, o.position_offset, seq, sign, cos, sin, stream));
  LOOM_CUDA_LAUNCH(
      op, kernels::RopeApply(internal::ElemOf(x.dtype()), x.raw_data(), cos, sin, seq * heads,
                             heads, x.dim(3), r, out->raw_data(), stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status RopeForward(const Tensor& x, const cpu::RopeOptions& o, Tensor* out) {
  return Rope("RopeForward", "x", x, "out", o, 1.0f, out);
}

absl::Status RopeBackward(const Tensor& dout, const cpu::RopeOptions& o, Tensor* dx) {
  return Rope("RopeBackward", "dout", dout, "dx", o, -1.0f, dx);
}

}  // namespace loom::core::cuda
