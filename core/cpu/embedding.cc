#include "core/cpu/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"

namespace loom::core::cpu {
namespace {

using internal::IndexAt;

absl::Status CheckArgs(const char* op, const Tensor& ids, const Tensor& table, const char* rows,
                       const Tensor& activ, const char* activ_name, const EmbeddingOptions& opts) {
  LOOM_RETURN_IF_ERROR(CheckRank(op, rows, table, 2));
  const int64_t n = ids.numel(), v = table.dim(0), c = table.dim(1);
  if (activ.rank() < 1 || activ.dim(activ.rank() - 1) != c || activ.numel() != n * c) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", activ_name, " is ", activ.DebugString(), ", expected ", n, " rows of ", c,
        " (ids ", ids.DebugString(), ", ", rows, " ", table.DebugString(), ")"));
  }
  if (opts.zero_out_of_range) return absl::OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = IndexAt(ids, i);
    if (id < opts.vocab_start || id >= opts.vocab_start + v) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ids[", i, "] = ", id, " is outside the table rows [",
                       opts.vocab_start, ", ", opts.vocab_start + v, ") of ", rows, " ",
                       table.DebugString(), " (set zero_out_of_range for a vocab-parallel shard)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor* out,
                              const EmbeddingOptions& opts) {
  constexpr const char* kOp = "EmbeddingForward";
  LOOM_RETURN_IF_ERROR(internal::CheckIndex(kOp, "ids", ids));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "table", table));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckArgs(kOp, ids, table, "table", *out, "out", opts));
  const int64_t n = ids.numel(), v = table.dim(0), c = table.dim(1);
  const float* pt = table.data<float>();
  float* po = out->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = IndexAt(ids, i) - opts.vocab_start;
    if (row >= 0 && row < v) {
      std::memcpy(po + i * c, pt + row * c, c * sizeof(float));
    } else {
      std::fill(po + i * c, po + (i + 1) * c, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor* dtable,
                               const EmbeddingOptions& opts) {
  constexpr const char* kOp = "EmbeddingBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckIndex(kOp, "ids", ids));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "dtable", dtable));
  LOOM_RETURN_IF_ERROR(CheckArgs(kOp, ids, *dtable, "dtable", dout, "dout", opts));
  const int64_t n = ids.numel(), v = dtable->dim(0), c = dtable->dim(1);
  const float* pd = dout.data<float>();
  float* pt = dtable->data<float>();
  // Thread t owns the table rows [v*t/T, v*(t+1)/T): no two threads write the
  // same row, and each row sums its tokens in token order (deterministic).
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = v * t / nt, hi = v * (t + 1) / nt;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = IndexAt(ids, i) - opts.vocab_start;
      if (row < lo || row >= hi) continue;
      float* dst = pt + row * c;
      const float* src = pd + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dst[j] += src[j];
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
