#include "core/cpu/attention_checks.h"

#include "core/cpu/check.h"
#include "core/status_macros.h"

namespace loom::core::cpu {

namespace internal {

absl::StatusOr<AttentionDims> CheckCpuAttentionForward(const char* op, const Tensor& qkv,
                                                       int64_t heads, Tensor* out,
                                                       AttentionSaved kind, Tensor* saved,
                                                       const AttentionDropout& dropout) {
  LOOM_RETURN_IF_ERROR(CheckInput(op, "qkv", qkv));
  LOOM_RETURN_IF_ERROR(CheckOutput(op, "out", out));
  LOOM_RETURN_IF_ERROR(CheckOutput(op, ops::SavedName(kind), saved));
  return ops::CheckAttentionForwardShapes(op, qkv, heads, *out, kind, *saved, dropout);
}

absl::StatusOr<AttentionDims> CheckCpuAttentionBackward(
    const char* op, const Tensor& dout, const Tensor& qkv, const Tensor* out, AttentionSaved kind,
    const Tensor& saved, int64_t heads, Tensor* dqkv, const AttentionDropout& dropout) {
  LOOM_RETURN_IF_ERROR(CheckInput(op, "dout", dout));
  LOOM_RETURN_IF_ERROR(CheckInput(op, "qkv", qkv));
  if (out != nullptr) LOOM_RETURN_IF_ERROR(CheckInput(op, "out", *out));
  LOOM_RETURN_IF_ERROR(CheckInput(op, ops::SavedName(kind), saved));
  LOOM_RETURN_IF_ERROR(CheckOutput(op, "dqkv", dqkv));
  return ops::CheckAttentionBackwardShapes(op, dout, qkv, out, kind, saved, heads, *dqkv, dropout);
}

}  // namespace internal
}  // namespace loom::core::cpu
