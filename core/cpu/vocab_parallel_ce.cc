#include "core/cpu/vocab_parallel_ce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu/check.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

// The row passes below are compiled for AVX2 and AVX-512 (LOOM_CPU_MULTIVERSION:
// the same operations in the same order, so both paths give the same bits).

LOOM_CPU_INLINE void RowMaxBody(const float* row, int64_t v, float* max) {
  *max = internal::MaxOf(row, v);
}
LOOM_CPU_MULTIVERSION(RowMax, (const float* row, int64_t v, float* max), (row, v, max))

// Elements per float partial sum of SumExpRow; the blocks' sums are added in
// double, so a row of 50k terms of very different size loses no more than a
// block of kSumBlock does.
constexpr int64_t kSumBlock = 1024;

// sum_j exp(row[j] - mx).
LOOM_CPU_INLINE void SumExpRowBody(const float* row, int64_t v, float mx, double* sum) {
  double s = 0;
  for (int64_t b = 0; b < v; b += kSumBlock) {
    const float* block = row + b;
    const int64_t len = std::min(kSumBlock, v - b);
    s += internal::SumOf(len, [&](int64_t j) { return internal::ExpF(block[j] - mx); });
  }
  *sum = s;
}
LOOM_CPU_MULTIVERSION(SumExpRow, (const float* row, int64_t v, float mx, double* sum),
                      (row, v, mx, sum))

// drow = exp(row - mx) * g.
LOOM_CPU_INLINE void ScaledExpRowBody(const float* row, float* drow, int64_t v, float mx,
                                      float g) {
#pragma omp simd
  for (int64_t j = 0; j < v; ++j) drow[j] = internal::ExpF(row[j] - mx) * g;
}
LOOM_CPU_MULTIVERSION(ScaledExpRow, (const float* row, float* drow, int64_t v, float mx, float g),
                      (row, drow, v, mx, g))

// sum * exp(local_max - max) in double, rounded once.
float RescaledSum(float sum, float local_max, float max) {
  // Equal maxima (TP 1, the shard holding the row max, both -inf) keep the
  // sum's bits; a shard without valid columns (-inf) contributes 0.
  if (local_max == max) return sum;
  return static_cast<float>(static_cast<double>(sum) *
                            std::exp(static_cast<double>(local_max) - static_cast<double>(max)));
}

// Checks the common arguments; returns the number of rows N.
absl::StatusOr<int64_t> CheckShard(const char* op, const Tensor& logits, const Tensor& targets,
                                   const VocabShard& shard) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput(op, "logits", logits));
  if (targets.defined()) LOOM_RETURN_IF_ERROR(internal::CheckIndex(op, "targets", targets));
  return ops::CheckVocabShardRows(op, logits, targets, shard);
}

// Every target inside the global vocabulary (ids are read on the host).
absl::Status CheckTargetsInVocabulary(const char* op, const Tensor& targets, int64_t n,
                                      const VocabShard& shard) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = internal::IndexAt(targets, i);
    if (t < 0 || t >= shard.vocab_size) {
      return absl::OutOfRangeError(absl::StrCat(op, ": target ", t, " at token ", i,
                                                " is outside the vocabulary [0, ",
                                                shard.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VocabShardRowMax(const Tensor& logits, const VocabShard& shard, Tensor* max) {
  constexpr const char* kOp = "VocabShardRowMax";
  absl::StatusOr<int64_t> rows = CheckShard(kOp, logits, Tensor(), shard);
  if (!rows.ok()) return rows.status();
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "max", max));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "max", *max, *rows, "one per row"));
  const int64_t n = *rows, vp = logits.dim(logits.rank() - 1);
  const float* l = logits.data<float>();
  float* m = max->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) RowMax(l + i * vp, shard.valid, &m[i]);
  return absl::OkStatus();
}

absl::Status VocabShardSumExp(const Tensor& logits, const Tensor& targets, const Tensor& max,
                              const VocabShard& shard, Tensor* sums) {
  constexpr const char* kOp = "VocabShardSumExp";
  absl::StatusOr<int64_t> rows = CheckShard(kOp, logits, targets, shard);
  if (!rows.ok()) return rows.status();
  const int64_t n = *rows, vp = logits.dim(logits.rank() - 1);
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "max", max));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "max", max, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "sums", sums));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "sums", *sums, 2 * n, "[2, rows]"));
  LOOM_RETURN_IF_ERROR(CheckTargetsInVocabulary(kOp, targets, n, shard));
  const float* l = logits.data<float>();
  const float* m = max.data<float>();
  float* sum = sums->data<float>();
  float* target_logit = sum + n;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = internal::IndexAt(targets, i) - shard.vocab_start;
    double s;
    SumExpRow(l + i * vp, shard.valid, m[i], &s);
    sum[i] = static_cast<float>(s);
    target_logit[i] = (t >= 0 && t < shard.valid) ? l[i * vp + t] - m[i] : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status VocabShardRowMaxSumExp(const Tensor& logits, const Tensor& targets,
                                    const VocabShard& shard, Tensor* max, Tensor* sums) {
  constexpr const char* kOp = "VocabShardRowMaxSumExp";
  LOOM_ASSIGN_OR_RETURN(const int64_t n, CheckShard(kOp, logits, targets, shard));
  const int64_t vp = logits.dim(logits.rank() - 1);
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "max", max));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "max", *max, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "sums", sums));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "sums", *sums, 2 * n, "[2, rows]"));
  LOOM_RETURN_IF_ERROR(CheckTargetsInVocabulary(kOp, targets, n, shard));
  const float* l = logits.data<float>();
  float* m = max->data<float>();
  float* sum = sums->data<float>();
  float* target_logit = sum + n;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // The same functions as the two passes, on a row still in the cache.
    const float* row = l + i * vp;
    RowMax(row, shard.valid, &m[i]);
    double s;
    SumExpRow(row, shard.valid, m[i], &s);
    sum[i] = static_cast<float>(s);
    const int64_t t = internal::IndexAt(targets, i) - shard.vocab_start;
    target_logit[i] = (t >= 0 && t < shard.valid) ? row[t] - m[i] : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status VocabShardRescaleSums(const Tensor& logits, const Tensor& targets,
                                   const Tensor& local_max, const Tensor& max,
                                   const VocabShard& shard, Tensor* sums) {
  constexpr const char* kOp = "VocabShardRescaleSums";
  LOOM_ASSIGN_OR_RETURN(const int64_t n, CheckShard(kOp, logits, targets, shard));
  const int64_t vp = logits.dim(logits.rank() - 1);
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "local_max", local_max));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "max", max));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "sums", sums));
  LOOM_RETURN_IF_ERROR(ops::CheckVocabRescaleArgs(kOp, n, local_max, max, sums));
  const float* l = logits.data<float>();
  const float* lm = local_max.data<float>();
  const float* gm = max.data<float>();
  float* sum = sums->data<float>();
  float* target_logit = sum + n;
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = RescaledSum(sum[i], lm[i], gm[i]);
    const int64_t t = internal::IndexAt(targets, i) - shard.vocab_start;
    target_logit[i] = (t >= 0 && t < shard.valid) ? l[i * vp + t] - gm[i] : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status VocabShardCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                            const Tensor& max, const Tensor& sum,
                                            const VocabShard& shard, float scale,
                                            Tensor* dlogits) {
  constexpr const char* kOp = "VocabShardCrossEntropyBackward";
  absl::StatusOr<int64_t> rows = CheckShard(kOp, logits, targets, shard);
  if (!rows.ok()) return rows.status();
  const int64_t n = *rows, vp = logits.dim(logits.rank() - 1);
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "max", max));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "max", max, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "sum", sum));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "sum", sum, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "dlogits", dlogits));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "dlogits", *dlogits, n * vp, "as logits"));
  const float* l = logits.data<float>();
  const float* m = max.data<float>();
  const float* s = sum.data<float>();
  float* g = dlogits->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float inv = 1.0f / s[i];
    ScaledExpRow(l + i * vp, g + i * vp, shard.valid, m[i], inv * scale);
    for (int64_t v = shard.valid; v < vp; ++v) g[i * vp + v] = 0.0f;  // padding
    const int64_t t = internal::IndexAt(targets, i) - shard.vocab_start;
    if (t >= 0 && t < shard.valid) g[i * vp + t] -= scale;
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
