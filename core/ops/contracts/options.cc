#include "core/ops/contracts/options.h"

#include "absl/strings/str_cat.h"
#include "core/ops/contracts/op_list.h"

namespace loom::core::ops {

const Tensor& DerefOrUndefined(const Tensor* t) {
  static const Tensor* const kUndefined = new Tensor;
  return t != nullptr ? *t : *kUndefined;
}

absl::Status CheckAttentionDropout(const char* op, const AttentionDropout& dr, int64_t heads) {
  const int64_t total = dr.total_heads == 0 ? heads : dr.total_heads;
  if (!(dr.p >= 0.0f && dr.p <= 1.0f) || dr.head_offset < 0 || dr.head_offset + heads > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": AttentionDropout{p = ", dr.p, ", head_offset = ", dr.head_offset,
        ", total_heads = ", dr.total_heads, "} with heads=", heads,
        ": need p in [0, 1] and 0 <= head_offset <= total_heads - heads"));
  }
  return absl::OkStatus();
}

absl::Status CheckDropoutArgs(const char* op, const Tensor& x, const DropoutOptions& opts,
                              const GlobalIndex& where) {
  if (!(opts.p >= 0.0f && opts.p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": p = ", opts.p, " is outside [0, 1] (x ", x.DebugString(), ")"));
  }
  if (x.rank() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " needs rank >= 1"));
  }
  const int64_t c = x.dim(x.rank() - 1);
  if (where.first_index < 0 || (where.row_stride != 0 && where.row_stride < c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": GlobalIndex{first_index = ", where.first_index, ", row_stride = ", where.row_stride,
        "} for x ", x.DebugString(), ": need first_index >= 0 and row_stride 0 or >= ", c));
  }
  return absl::OkStatus();
}

absl::Status GemmMatrixDims(const char* op, const Tensor& a, const Tensor& b, const Tensor& c,
                            const MatmulOptions& opts, GemmDims* dims) {
  const int r = a.rank();
  const int64_t a0 = a.dim(r - 2), a1 = a.dim(r - 1);
  const int64_t b0 = b.dim(r - 2), b1 = b.dim(r - 1);
  const int64_t m = opts.trans_a ? a1 : a0, ka = opts.trans_a ? a0 : a1;
  const int64_t kb = opts.trans_b ? b1 : b0, n = opts.trans_b ? b0 : b1;
  if (ka != kb) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": a ", a.DebugString(), opts.trans_a ? " (transposed)" : "", " and b ",
        b.DebugString(), opts.trans_b ? " (transposed)" : "", ": inner dims ", ka, " vs ", kb));
  }
  if (c.dim(r - 2) != m || c.dim(r - 1) != n) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": c is ", c.DebugString(), ", expected [",
                                                   m, ", ", n, "] from a ", a.DebugString(),
                                                   " and b ", b.DebugString()));
  }
  *dims = {m, n, ka};
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GemmBatchCount(const char* op, const Tensor& a, const Tensor& b,
                                       const Tensor& c) {
  const int r = a.rank();
  if (r < 3 || b.rank() != r || c.rank() != r) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": a ", a.DebugString(), ", b ", b.DebugString(), ", c ", c.DebugString(),
        ": expected all of rank 3 or all of rank 4 (batch dims first)"));
  }
  int64_t batch = 1;
  for (int i = 0; i < r - 2; ++i) {
    if (a.dim(i) != b.dim(i) || a.dim(i) != c.dim(i)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": batch dim ", i, " differs: a ",
                                                     a.DebugString(), ", b ", b.DebugString(),
                                                     ", c ", c.DebugString()));
    }
    batch *= a.dim(i);
  }
  return batch;
}

}  // namespace loom::core::ops
