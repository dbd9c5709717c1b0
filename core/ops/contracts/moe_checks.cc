#include "core/ops/contracts/moe_checks.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::core::ops {
namespace {

absl::Status Bad(const char* op, const char* name, const Tensor& t, const std::string& want) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " is ", t.DebugString(), ", expected ", want));
}

absl::Status NotNull(const char* op, const char* name, const Tensor* t) {
  if (t == nullptr || !t->defined()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": output ", name, " is missing"));
  }
  return absl::OkStatus();
}

// `t` is a defined [rows, cols] matrix (`what` names the dims).
absl::Status Matrix(const char* op, const char* name, const Tensor& t, const char* what) {
  if (!t.defined() || t.rank() != 2) return Bad(op, name, t, what);
  return absl::OkStatus();
}

absl::Status Same(const char* op, const char* name, const Tensor& t, const char* like_name,
                  const Tensor& like) {
  if (!t.defined() || t.shape() != like.shape()) {
    return Bad(op, name, t, absl::StrCat(like.shape().ToString(), " as ", like_name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMoeRouteOptions(const char* op, const MoeRouteOptions& o) {
  if (o.experts < 1 || o.topk < 1 || o.topk > o.experts || o.capacity < 0 ||
      (o.pad_to_capacity && o.capacity == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": MoeRouteOptions top-", o.topk, " of ", o.experts, " experts, capacity ",
        o.capacity, o.pad_to_capacity ? " padded" : "",
        ": expected 1 <= topk <= experts, capacity >= 0 (padding needs one)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MoeDims> CheckMoeRouteTopK(const char* op, const Tensor& logits,
                                          const MoeRouteOptions& o, const Tensor* expert,
                                          const Tensor* prob, const Tensor* stats) {
  LOOM_RETURN_IF_ERROR(CheckMoeRouteOptions(op, o));
  if (!logits.defined() || logits.rank() != 2 || logits.dim(1) != o.experts) {
    return Bad(op, "logits", logits, absl::StrCat("[T, ", o.experts, "]"));
  }
  LOOM_RETURN_IF_ERROR(NotNull(op, "expert", expert));
  LOOM_RETURN_IF_ERROR(NotNull(op, "prob", prob));
  LOOM_RETURN_IF_ERROR(NotNull(op, "stats", stats));
  const Shape tk{logits.dim(0), o.topk};
  if (expert->shape() != tk) return Bad(op, "expert", *expert, tk.ToString());
  if (prob->shape() != tk) return Bad(op, "prob", *prob, tk.ToString());
  if (stats->numel() != 2 * o.experts + 1) {
    return Bad(op, "stats", *stats,
               absl::StrCat(2 * o.experts + 1, " elements (counts, probability sums, z sum)"));
  }
  return MoeDims{logits.dim(0), o.experts, o.topk, 0, 0};
}

absl::StatusOr<MoeDims> CheckMoeRouteLayout(const char* op, const Tensor& expert,
                                            const Tensor& prob, const MoeRouteOptions& o,
                                            const Tensor* row, const Tensor* row_token) {
  LOOM_RETURN_IF_ERROR(CheckMoeRouteOptions(op, o));
  if (!expert.defined() || expert.rank() != 2 || expert.dim(1) != o.topk) {
    return Bad(op, "expert", expert, absl::StrCat("[T, ", o.topk, "]"));
  }
  LOOM_RETURN_IF_ERROR(Same(op, "prob", prob, "expert", expert));
  LOOM_RETURN_IF_ERROR(NotNull(op, "row", row));
  LOOM_RETURN_IF_ERROR(NotNull(op, "row_token", row_token));
  LOOM_RETURN_IF_ERROR(Same(op, "row", *row, "expert", expert));
  if (row_token->rank() != 1) return Bad(op, "row_token", *row_token, "[N]");
  return MoeDims{expert.dim(0), o.experts, o.topk, row_token->dim(0), 0};
}

absl::StatusOr<MoeDims> CheckMoePermute(const char* op, const Tensor& x, const Tensor& row_token,
                                        const Tensor* out) {
  LOOM_RETURN_IF_ERROR(Matrix(op, "x", x, "[T, h]"));
  if (!row_token.defined() || row_token.rank() != 1) return Bad(op, "row_token", row_token, "[N]");
  LOOM_RETURN_IF_ERROR(NotNull(op, "out", out));
  const Shape want{row_token.dim(0), x.dim(1)};
  if (out->shape() != want) return Bad(op, "out", *out, want.ToString());
  return MoeDims{x.dim(0), 0, 0, row_token.dim(0), x.dim(1)};
}

absl::StatusOr<MoeDims> CheckMoePermuteBackward(const char* op, const Tensor& drows,
                                                const Tensor& row, const Tensor* dx) {
  LOOM_RETURN_IF_ERROR(Matrix(op, "drows", drows, "[N, h]"));
  LOOM_RETURN_IF_ERROR(Matrix(op, "row", row, "[T, K]"));
  LOOM_RETURN_IF_ERROR(NotNull(op, "dx", dx));
  const Shape want{row.dim(0), drows.dim(1)};
  if (dx->shape() != want) return Bad(op, "dx", *dx, want.ToString());
  return MoeDims{row.dim(0), 0, row.dim(1), drows.dim(0), drows.dim(1)};
}

absl::StatusOr<MoeDims> CheckMoeCombine(const char* op, const Tensor& rows, const Tensor& prob,
                                        const Tensor& row, const char* tokens_name,
                                        const Tensor* tokens) {
  LOOM_RETURN_IF_ERROR(Matrix(op, "rows", rows, "[N, h]"));
  LOOM_RETURN_IF_ERROR(Matrix(op, "prob", prob, "[T, K]"));
  LOOM_RETURN_IF_ERROR(Same(op, "row", row, "prob", prob));
  LOOM_RETURN_IF_ERROR(NotNull(op, tokens_name, tokens));
  const Shape want{prob.dim(0), rows.dim(1)};
  if (tokens->shape() != want) return Bad(op, tokens_name, *tokens, want.ToString());
  return MoeDims{prob.dim(0), 0, prob.dim(1), rows.dim(0), rows.dim(1)};
}

absl::StatusOr<MoeDims> CheckMoeCombineBackward(const char* op, const Tensor& dy,
                                                const Tensor& rows, const Tensor& prob,
                                                const Tensor& row, const Tensor* drows,
                                                const Tensor* dprob) {
  LOOM_ASSIGN_OR_RETURN(MoeDims d, CheckMoeCombine(op, rows, prob, row, "dy", &dy));
  LOOM_RETURN_IF_ERROR(NotNull(op, "drows", drows));
  LOOM_RETURN_IF_ERROR(NotNull(op, "dprob", dprob));
  LOOM_RETURN_IF_ERROR(Same(op, "drows", *drows, "rows", rows));
  LOOM_RETURN_IF_ERROR(Same(op, "dprob", *dprob, "prob", prob));
  return d;
}

absl::StatusOr<MoeDims> CheckMoeRouterBackward(const char* op, const Tensor& logits,
                                               const Tensor& expert, const Tensor& prob,
                                               const Tensor& dprob, const Tensor& aux_grad,
                                               const MoeRouterBackwardOptions& o,
                                               const Tensor* dlogits) {
  LOOM_RETURN_IF_ERROR(Matrix(op, "logits", logits, "[T, E]"));
  if (!expert.defined() || expert.rank() != 2 || expert.dim(0) != logits.dim(0) ||
      expert.dim(1) < 1 || expert.dim(1) > logits.dim(1)) {
    return Bad(op, "expert", expert, absl::StrCat("[", logits.dim(0), ", K] with 1 <= K <= ",
                                                  logits.dim(1), " (logits ",
                                                  logits.DebugString(), ")"));
  }
  LOOM_RETURN_IF_ERROR(Same(op, "prob", prob, "expert", expert));
  LOOM_RETURN_IF_ERROR(Same(op, "dprob", dprob, "expert", expert));
  if (o.aux_loss && (!aux_grad.defined() || aux_grad.numel() != logits.dim(1))) {
    return Bad(op, "aux_grad", aux_grad, absl::StrCat(logits.dim(1), " elements (one per expert)"));
  }
  if (!std::isfinite(o.z_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": MoeRouterBackwardOptions.z_scale is ", o.z_scale, ", expected finite"));
  }
  LOOM_RETURN_IF_ERROR(NotNull(op, "dlogits", dlogits));
  LOOM_RETURN_IF_ERROR(Same(op, "dlogits", *dlogits, "logits", logits));
  return MoeDims{logits.dim(0), logits.dim(1), expert.dim(1), 0, 0};
}

}  // namespace loom::core::ops
