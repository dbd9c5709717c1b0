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

absl::StatusOr<FlashBlockDims> CheckFlashBlock(const char* op, const Tensor& qkv,
                                               const Tensor& kv, const FlashBlockOptions& o) {
  AttentionDims g;
  LOOM_RETURN_IF_ERROR(CheckQkv(op, qkv, o.heads, &g));
  LOOM_RETURN_IF_ERROR(CheckRank(op, "kv", kv, 3));
  if (kv.dim(1) != g.b || kv.dim(2) != g.heads * 2 * g.d) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": kv ", kv.DebugString(), " must be [rows, ",
                                                   g.b, ", ", g.heads * 2 * g.d,
                                                   "] (qkv's b, heads * 2 * head_dim)"));
  }
  const FlashBlockDims dims{g.s, kv.dim(0), g.b, g.heads, g.d};
  auto inside = [&](const char* what, int64_t first, int64_t len, int64_t limit,
                    const char* of) -> absl::Status {
    if (first < 0 || len < 0 || first + len > limit) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " [", first, ", ",
                                                     first + len, ") outside the ", limit, " ",
                                                     of));
    }
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(inside("query rows", o.q_row, o.q_len, dims.rows, "rows of qkv"));
  LOOM_RETURN_IF_ERROR(inside("key rows", o.k_row, o.k_len, dims.kv_rows, "rows of kv"));
  LOOM_RETURN_IF_ERROR(inside("query positions", o.q_start, o.q_len, o.seq_len,
                              "positions of the sequence (seq_len)"));
  LOOM_RETURN_IF_ERROR(inside("key positions", o.k_start, o.k_len, o.seq_len,
                              "positions of the sequence (seq_len)"));
  LOOM_RETURN_IF_ERROR(CheckAttentionDropout(op, o.dropout, o.heads));
  return dims;
}

absl::Status CheckFlashState(const char* op, const FlashBlockDims& g, const Tensor& acc,
                             const Tensor& max, const Tensor& sum) {
  LOOM_RETURN_IF_ERROR(CheckShape(op, "acc", acc, Shape{g.b, g.heads, g.rows, g.d}));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "max", max, Shape{g.b, g.heads, g.rows}));
  return CheckShape(op, "sum", sum, Shape{g.b, g.heads, g.rows});
}

absl::StatusOr<FlashBlockDims> CheckFlashStateAlone(const char* op, const Tensor& acc,
                                                    const Tensor& max, const Tensor& sum) {
  LOOM_RETURN_IF_ERROR(CheckRank(op, "acc", acc, 4));
  const FlashBlockDims g{acc.dim(2), 0, acc.dim(0), acc.dim(1), acc.dim(3)};
  LOOM_RETURN_IF_ERROR(CheckFlashState(op, g, acc, max, sum));
  return g;
}

absl::StatusOr<FlashBlockDims> CheckFlashKv(const char* op, const char* qkv_name,
                                            const Tensor& qkv, int64_t heads,
                                            const char* kv_name, const Tensor& kv) {
  LOOM_RETURN_IF_ERROR(CheckRank(op, qkv_name, qkv, 3));
  if (heads <= 0 || qkv.dim(2) == 0 || qkv.dim(2) % (3 * heads) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", qkv_name, " ", qkv.DebugString(), " with heads=", heads,
                     ": last dim must be heads * 3 * head_dim with head_dim > 0"));
  }
  const int64_t d = qkv.dim(2) / (3 * heads);
  LOOM_RETURN_IF_ERROR(CheckShape(op, kv_name, kv, Shape{qkv.dim(0), qkv.dim(1), heads * 2 * d}));
  return FlashBlockDims{qkv.dim(0), qkv.dim(0), qkv.dim(1), heads, d};
}

}  // namespace loom::core::ops
