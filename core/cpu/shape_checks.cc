#include "core/cpu/shape_checks.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::core::cpu {

absl::Status CheckShape(const char* op, const char* name, const Tensor& t, const Shape& want) {
  if (t.shape() != want) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is ", t.DebugString(),
                                                   ", expected shape ", want.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckLastDimVector(const char* op, const char* x_name, const Tensor& x,
                                const char* vec_name, const Tensor& vec) {
  LOOM_RETURN_IF_ERROR(CheckRank(op, vec_name, vec, 1));
  if (x.rank() < 1 || x.dim(x.rank() - 1) != vec.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", x_name, " ", x.DebugString(), " and ",
                                                   vec_name, " ", vec.DebugString(),
                                                   ": last dim must equal the ", vec_name,
                                                   " length"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CheckLogitsTargets(const char* op, const Tensor& logits,
                                           const Tensor& targets) {
  if (logits.rank() < 1 || logits.dim(logits.rank() - 1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": logits ", logits.DebugString(),
                                                   " need rank >= 1 and a non-empty vocab dim"));
  }
  const int64_t n = logits.numel() / logits.dim(logits.rank() - 1);
  if (targets.numel() != n) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": targets ", targets.DebugString(),
                                                   " must have one entry per row of logits ",
                                                   logits.DebugString(), " (", n, " rows)"));
  }
  return n;
}

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

absl::Status CheckAttentionDropout(const char* op, float p, int64_t head_offset,
                                   int64_t total_heads, int64_t heads) {
  const int64_t total = total_heads == 0 ? heads : total_heads;
  if (!(p >= 0.0f && p <= 1.0f) || head_offset < 0 || head_offset + heads > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": AttentionDropout{p = ", p, ", head_offset = ", head_offset,
        ", total_heads = ", total_heads, "} with heads=", heads,
        ": need p in [0, 1] and 0 <= head_offset <= total_heads - heads"));
  }
  return absl::OkStatus();
}

absl::Status CheckDropout(const char* op, const Tensor& x, float p, int64_t first_index,
                          int64_t row_stride) {
  if (!(p >= 0.0f && p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": p = ", p, " is outside [0, 1] (x ", x.DebugString(), ")"));
  }
  if (x.rank() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " needs rank >= 1"));
  }
  const int64_t c = x.dim(x.rank() - 1);
  if (first_index < 0 || (row_stride != 0 && row_stride < c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": GlobalIndex{first_index = ", first_index, ", row_stride = ", row_stride,
        "} for x ", x.DebugString(), ": need first_index >= 0 and row_stride 0 or >= ", c));
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
