#include "core/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::IndexAt;

// Checks targets against logits; returns the number of non-ignored tokens.
absl::StatusOr<int64_t> CheckTargets(const char* op, const Tensor& logits, const Tensor& targets,
                                     const CrossEntropyOptions& opts) {
  LOOM_ASSIGN_OR_RETURN(const int64_t n, ops::CheckLogitsTargets(op, logits, targets));
  const int64_t v = logits.dim(logits.rank() - 1);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = IndexAt(targets, i);
    if (t == opts.ignore_index) continue;
    if (t < 0 || t >= v) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": targets[", i, "] = ", t,
                                                     " is outside the vocab [0, ", v,
                                                     ") of logits ", logits.DebugString()));
    }
    ++count;
  }
  return count;
}

// logsumexp of one row.
LOOM_CPU_INLINE void LogSumExpRowBody(const float* row, int64_t v, float* lse) {
  const float mx = internal::MaxOf(row, v);
  const float sum = internal::SumOf(v, [&](int64_t j) { return internal::ExpF(row[j] - mx); });
  *lse = mx + std::log(sum);
}
LOOM_CPU_MULTIVERSION(LogSumExpRow, (const float* row, int64_t v, float* lse), (row, v, lse))

// drow = exp(row - lse) * g (drow may alias row).
LOOM_CPU_INLINE void SoftmaxScaledRowBody(const float* row, float* drow, int64_t v, float lse,
                                          float g) {
#pragma omp simd
  for (int64_t j = 0; j < v; ++j) drow[j] = internal::ExpF(row[j] - lse) * g;
}
LOOM_CPU_MULTIVERSION(SoftmaxScaledRow,
                      (const float* row, float* drow, int64_t v, float lse, float g),
                      (row, drow, v, lse, g))

}  // namespace

absl::StatusOr<double> CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                           Tensor* losses, Tensor* lse,
                                           const CrossEntropyOptions& opts) {
  constexpr const char* kOp = "CrossEntropyForward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(internal::CheckIndex(kOp, "targets", targets));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "losses", losses));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "lse", lse));
  absl::StatusOr<int64_t> count = CheckTargets(kOp, logits, targets, opts);
  if (!count.ok()) return count.status();
  const int64_t v = logits.dim(logits.rank() - 1), n = logits.numel() / v;
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "losses", *losses, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "lse", *lse, n, "one per row"));
  const float* pl = logits.data<float>();
  float* ploss = losses->data<float>();
  float* plse = lse->data<float>();
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = pl + i * v;
    float l;
    LogSumExpRow(row, v, &l);
    plse[i] = l;
    const int64_t t = IndexAt(targets, i);
    const float loss = t == opts.ignore_index ? 0.0f : l - row[t];
    ploss[i] = loss;
    total += loss;
  }
  return *count == 0 ? 0.0 : total / static_cast<double>(*count);
}

absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  float dloss, Tensor* dlogits, const CrossEntropyOptions& opts) {
  constexpr const char* kOp = "CrossEntropyBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(internal::CheckIndex(kOp, "targets", targets));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "lse", lse));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "dlogits", dlogits));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "logits", logits, "dlogits", *dlogits));
  absl::StatusOr<int64_t> count = CheckTargets(kOp, logits, targets, opts);
  if (!count.ok()) return count.status();
  const int64_t v = logits.dim(logits.rank() - 1), n = logits.numel() / v;
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "lse", lse, n, "one per row"));
  const float* pl = logits.data<float>();
  const float* plse = lse.data<float>();
  float* pd = dlogits->data<float>();
  const float g = *count == 0 ? 0.0f : dloss / static_cast<float>(*count);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = pl + i * v;
    float* drow = pd + i * v;
    const int64_t t = IndexAt(targets, i);
    if (t == opts.ignore_index) {
      std::fill(drow, drow + v, 0.0f);
      continue;
    }
    const float l = plse[i];
    const float target_logit = row[t];  // read before an in-place overwrite
    SoftmaxScaledRow(row, drow, v, l, g);
    drow[t] = (internal::ExpF(target_logit - l) - 1.0f) * g;
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
