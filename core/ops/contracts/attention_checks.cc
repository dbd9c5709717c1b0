#include "core/ops/contracts/attention_checks.h"

#include "absl/strings/str_cat.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/status_macros.h"

namespace loom::core::ops {

absl::Status CheckQkv(const char* op, const Tensor& qkv, int64_t heads, AttentionDims* dims) {
  LOOM_RETURN_IF_ERROR(CheckRank(op, "qkv", qkv, 3));
  if (heads <= 0 || qkv.dim(2) % (3 * heads) != 0 || qkv.dim(2) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": qkv ", qkv.DebugString(), " with heads=", heads,
                     ": last dim must be heads * 3 * head_dim with head_dim > 0"));
  }
  *dims = {qkv.dim(0), qkv.dim(1), heads, qkv.dim(2) / (3 * heads)};
  return absl::OkStatus();
}

const char* SavedName(AttentionSaved kind) {
  return kind == AttentionSaved::kProbs ? "probs" : "lse";
}

Shape SavedShape(AttentionSaved kind, const AttentionDims& g) {
  return kind == AttentionSaved::kProbs ? Shape{g.b, g.heads, g.s, g.s} : Shape{g.b, g.heads, g.s};
}

absl::StatusOr<AttentionDims> CheckAttentionForwardShapes(const char* op, const Tensor& qkv,
                                                          int64_t heads, const Tensor& out,
                                                          AttentionSaved kind, const Tensor& saved,
                                                          const AttentionDropout& dropout) {
  AttentionDims g;
  LOOM_RETURN_IF_ERROR(CheckQkv(op, qkv, heads, &g));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "out", out, Shape{g.s, g.b, g.heads * g.d}));
  LOOM_RETURN_IF_ERROR(CheckShape(op, SavedName(kind), saved, SavedShape(kind, g)));
  LOOM_RETURN_IF_ERROR(CheckAttentionDropout(op, dropout, heads));
  return g;
}

absl::StatusOr<AttentionDims> CheckAttentionBackwardShapes(
    const char* op, const Tensor& dout, const Tensor& qkv, const Tensor* out, AttentionSaved kind,
    const Tensor& saved, int64_t heads, const Tensor& dqkv, const AttentionDropout& dropout) {
  AttentionDims g;
  LOOM_RETURN_IF_ERROR(CheckQkv(op, qkv, heads, &g));
  const Shape out_shape{g.s, g.b, g.heads * g.d};
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dout", dout, out_shape));
  if (out != nullptr) LOOM_RETURN_IF_ERROR(CheckShape(op, "out", *out, out_shape));
  LOOM_RETURN_IF_ERROR(CheckShape(op, SavedName(kind), saved, SavedShape(kind, g)));
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, "qkv", qkv, "dqkv", dqkv));
  LOOM_RETURN_IF_ERROR(CheckAttentionDropout(op, dropout, heads));
  return g;
}

}  // namespace loom::core::ops
