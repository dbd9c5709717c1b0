#include "core/ops/contracts/shape_checks.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::core::ops {

absl::Status CheckNumel(const char* op, const char* arg, const Tensor& t, int64_t numel,
                        const std::string& why) {
  if (t.numel() != numel) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is ", t.DebugString(),
                                                   ", expected ", numel, " elements (", why, ")"));
  }
  return absl::OkStatus();
}

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

namespace {

// The rows of x [..., C] normalised by gamma [C], C > 0.
absl::StatusOr<int64_t> NormRows(const char* op, const Tensor& x, const Tensor& gamma) {
  LOOM_RETURN_IF_ERROR(CheckLastDimVector(op, "x", x, "gamma", gamma));
  const int64_t c = gamma.dim(0);
  if (c == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " has an empty last dim"));
  }
  return x.numel() / c;
}

}  // namespace

absl::StatusOr<int64_t> CheckLayerNormRows(const char* op, const Tensor& x, const Tensor& gamma,
                                           const Tensor& mean, const Tensor& rstd) {
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, NormRows(op, x, gamma));
  LOOM_RETURN_IF_ERROR(CheckNumel(op, "mean", mean, rows, "one per row of x"));
  LOOM_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows, "one per row of x"));
  return rows;
}

absl::StatusOr<int64_t> CheckRmsNormRows(const char* op, const Tensor& x, const Tensor& gamma,
                                         const Tensor& rstd) {
  LOOM_ASSIGN_OR_RETURN(const int64_t rows, NormRows(op, x, gamma));
  LOOM_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows, "one per row of x"));
  return rows;
}

absl::Status CheckNormGradients(const char* op, const Tensor& x, const Tensor& gamma,
                                const Tensor& dout, const Tensor& dx, const Tensor& dgamma) {
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, "gamma", gamma, "dgamma", dgamma));
  LOOM_RETURN_IF_ERROR(CheckSameShape(op, "x", x, "dout", dout));
  return CheckSameShape(op, "x", x, "dx", dx);
}

absl::StatusOr<SwigluDims> CheckSwigluHalves(const char* op, const Tensor& x, const char* half_name,
                                             const Tensor& half) {
  const int rank = x.rank();
  if (rank < 1 || x.dim(rank - 1) == 0 || x.dim(rank - 1) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": x ", x.DebugString(), ": last dim must be 2F > 0 ([gate | up] halves of F each)"));
  }
  const int64_t f = x.dim(rank - 1) / 2;
  bool ok = half.rank() == rank && half.dim(rank - 1) == f;
  for (int i = 0; ok && i + 1 < rank; ++i) ok = half.dim(i) == x.dim(i);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", half_name, " is ", half.DebugString(),
                                                   ", expected x ", x.DebugString(),
                                                   "'s shape with the last dim halved (", f, ")"));
  }
  return SwigluDims{x.numel() / (2 * f), f};
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

absl::Status CheckParamCopy(const char* op, const Tensor& param, const Tensor* param_copy) {
  if (param_copy == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": param_copy is null"));
  }
  if (param_copy->dtype() != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": param_copy is ",
                                                   param_copy->DebugString(),
                                                   ", expected bf16 (the compute copy)"));
  }
  return CheckNumel(op, "param_copy", *param_copy, param.numel(), "same as param");
}

absl::StatusOr<int64_t> CheckVocabShardRows(const char* op, const Tensor& logits,
                                            const Tensor& targets, const VocabShard& shard) {
  if (logits.rank() < 1 || logits.dim(logits.rank() - 1) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": logits ", logits.DebugString(), ", expected [..., Vp > 0]"));
  }
  const int64_t vp = logits.dim(logits.rank() - 1), n = logits.numel() / vp;
  if (shard.valid < 0 || shard.valid > vp || shard.vocab_start < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shard vocab_start ", shard.vocab_start,
                                                   " valid ", shard.valid, " does not fit Vp ", vp));
  }
  if (targets.defined()) LOOM_RETURN_IF_ERROR(CheckNumel(op, "targets", targets, n, "one per row"));
  return n;
}

absl::Status CheckVocabRescaleArgs(const char* op, int64_t rows, const Tensor& local_max,
                                   const Tensor& max, const Tensor* sums) {
  LOOM_RETURN_IF_ERROR(CheckNumel(op, "local_max", local_max, rows, "one per row"));
  LOOM_RETURN_IF_ERROR(CheckNumel(op, "max", max, rows, "one per row"));
  if (sums == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": sums is null"));
  return CheckNumel(op, "sums", *sums, 2 * rows, "[2, rows]");
}

}  // namespace loom::core::ops
