#include "core/cuda/qkv_split.h"

#include "core/cuda/check_args.h"
#include "core/ops/contracts/qkv_split_checks.h"

namespace loom::core::cuda {
namespace {

absl::Status QkvSplit(const char* op, bool backward, const char* in_name, const Tensor& in,
                      const char* out_name, Tensor* out, const ops::QkvSplitOptions& o) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, in_name, in));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(op, out_name, out));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, in_name, in, out_name, *out));
  LOOM_ASSIGN_OR_RETURN(const ops::QkvSplitDims g,
                        backward ? ops::CheckQkvSplitArgs(op, out_name, *out, in_name, in, o)
                                 : ops::CheckQkvSplitArgs(op, in_name, in, out_name, *out, o));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(op, {{in_name, &in}, {out_name, out}}));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(op, "token rows (S * B)", g.s * g.b));
  if (in.numel() == 0) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  const kernels::Elem t = internal::ElemOf(in.dtype());
  const float base = o.rope_options.base;
  const int64_t offset = o.rope_options.position_offset;
  LOOM_CUDA_LAUNCH(op, backward ? kernels::QkvSplitBackward(t, in.raw_data(), g.s * g.b, g.b,
                                                            g.groups, g.n, g.d, g.r, base, offset,
                                                            out->raw_data(), stream)
                                : kernels::QkvSplitForward(t, in.raw_data(), g.s * g.b, g.b,
                                                           g.groups, g.n, g.d, g.r, base, offset,
                                                           out->raw_data(), stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status QkvSplitRopeForward(const Tensor& proj, const ops::QkvSplitOptions& o, Tensor* qkv) {
  return QkvSplit("QkvSplitRopeForward", false, "proj", proj, "qkv", qkv, o);
}

absl::Status QkvSplitRopeBackward(const Tensor& dqkv, const ops::QkvSplitOptions& o,
                                  Tensor* dproj) {
  return QkvSplit("QkvSplitRopeBackward", true, "dqkv", dqkv, "dproj", dproj, o);
}

}  // namespace loom::core::cuda
