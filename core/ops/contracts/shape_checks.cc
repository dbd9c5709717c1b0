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

absl::Status CheckDoubleAccumulator(const char* op, const Tensor* acc) {
  if (acc == nullptr || !acc->defined() || acc->dtype() != DType::kF64 || acc->numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": acc is ", acc != nullptr && acc->defined() ? acc->DebugString() : "undefined",
        ", expected an f64 tensor of one element"));
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

namespace {

absl::Status NotNull(const char* op, const char* name, const Tensor* t) {
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null"));
  return absl::OkStatus();
}

// a [N, ·] and b [N, ·]: the same row count (the GEMM's token dimension).
absl::Status SameRows(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                      const Tensor& b) {
  LOOM_RETURN_IF_ERROR(CheckRank(op, a_name, a, 2));
  LOOM_RETURN_IF_ERROR(CheckRank(op, b_name, b, 2));
  if (a.dim(0) != b.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", a_name, " ", a.DebugString(), " and ",
                                                   b_name, " ", b.DebugString(),
                                                   " must have the same rows"));
  }
  return absl::OkStatus();
}

absl::Status OptionalVector(const char* op, const char* name, const Tensor* v, int64_t n) {
  if (v == nullptr) return absl::OkStatus();
  return CheckShape(op, name, *v, Shape{n});
}

}  // namespace

absl::Status CheckLinearForward(const char* op, const Tensor& x, const Tensor& w,
                                const Tensor& bias, const Tensor* y, const Tensor* pre,
                                const LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(NotNull(op, "y", y));
  LOOM_RETURN_IF_ERROR(CheckRank(op, "w", w, 2));
  LOOM_RETURN_IF_ERROR(SameRows(op, "x", x, "y", *y));
  const int64_t n = x.dim(0), m = w.dim(0), k = w.dim(1);
  LOOM_RETURN_IF_ERROR(CheckShape(op, "x", x, Shape{n, k}));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "y", *y, Shape{n, m}));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "bias", bias, Shape{m}));
  if (!opts.gelu) {
    if (pre != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": pre is kept only with gelu (got ", pre->DebugString(), ")"));
    }
    return absl::OkStatus();
  }
  LOOM_RETURN_IF_ERROR(NotNull(op, "pre (gelu keeps the pre-activation)", pre));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "pre", *pre, Shape{n, m}));
  if (m * n > 0 && pre->raw_data() == y->raw_data()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": pre and y share storage"));
  }
  return absl::OkStatus();
}

absl::Status CheckLinearBackwardData(const char* op, const Tensor& dy, const Tensor& w,
                                     const Tensor& pre, const Tensor* dx, const Tensor* dbias,
                                     const LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(NotNull(op, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckRank(op, "w", w, 2));
  LOOM_RETURN_IF_ERROR(SameRows(op, "dy", dy, "dx", *dx));
  const int64_t n = dy.dim(0), m = w.dim(0), k = w.dim(1);
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dy", dy, Shape{n, m}));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dx", *dx, Shape{n, k}));
  if (opts.gelu) LOOM_RETURN_IF_ERROR(CheckShape(op, "pre", pre, Shape{n, k}));
  if (dbias != nullptr && !opts.gelu) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dbias (the gradient of the bias before the GELU) needs gelu"));
  }
  return OptionalVector(op, "dbias", dbias, k);
}

absl::Status CheckLinearBackwardWeight(const char* op, const Tensor& dy, const Tensor& x,
                                       const Tensor* dw, const Tensor* dbias,
                                       const LinearOptions& opts) {
  if (opts.gelu) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": gelu does not apply to the weight gradient"));
  }
  LOOM_RETURN_IF_ERROR(NotNull(op, "dw", dw));
  LOOM_RETURN_IF_ERROR(SameRows(op, "dy", dy, "x", x));
  LOOM_RETURN_IF_ERROR(CheckShape(op, "dw", *dw, Shape{dy.dim(1), x.dim(1)}));
  return OptionalVector(op, "dbias", dbias, dy.dim(1));
}

}  // namespace loom::core::ops
