#include "layers/vocab_parallel.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/cpu/embedding.h"
#include "core/status_macros.h"
#include "layers/mappings.h"

namespace loom::layers {

using core::Shape;
using core::Tensor;

int64_t PaddedVocabSize(int64_t vocab_size, int64_t divisible_by, int tp_size) {
  const int64_t multiple = divisible_by * tp_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

// ------------------------------------------------------------------ embedding

absl::StatusOr<Tensor> VocabParallelEmbedding::Forward(const Tensor& ids, Saved* saved) const {
  if (ids.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("VocabParallelEmbedding: ids ",
                                                   ids.DebugString(), ", expected i32[s, b]"));
  }
  const int64_t h = w_->value.dim(1);
  saved->ids = ids;
  core::cpu::EmbeddingOptions opts;
  opts.vocab_start = w_->split_start;
  opts.zero_out_of_range = true;
  LOOM_ASSIGN_OR_RETURN(Tensor partial,
                        Tensor::Empty(Shape{ids.dim(0), ids.dim(1), h}, core::DType::kF32));
  LOOM_RETURN_IF_ERROR(core::cpu::EmbeddingForward(ids, w_->value, &partial, opts));
  if (tp_.sequence_parallel) return ReduceScatterSeq(tp_, partial);
  LOOM_RETURN_IF_ERROR(AllReduceTp(tp_, partial));
  return partial;
}

absl::Status VocabParallelEmbedding::Backward(const Tensor& dy, const Saved& saved) const {
  Tensor full = dy;
  if (tp_.sequence_parallel) {
    LOOM_ASSIGN_OR_RETURN(full, AllGatherSeq(tp_, dy));
  }
  core::cpu::EmbeddingOptions opts;
  opts.vocab_start = w_->split_start;
  opts.zero_out_of_range = true;
  return core::cpu::EmbeddingBackward(saved.ids, full, &w_->grad, opts);
}

// -------------------------------------------------------------- cross-entropy

namespace {

int64_t TargetAt(const Tensor& t, int64_t i) {
  return t.dtype() == core::DType::kI32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
}

}  // namespace

absl::StatusOr<double> VocabParallelCrossEntropy::Forward(const Tensor& logits,
                                                          const Tensor& targets,
                                                          Saved* saved) const {
  if (logits.rank() != 3 || targets.rank() != 2 || logits.dim(0) != targets.dim(0) ||
      logits.dim(1) != targets.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "VocabParallelCrossEntropy: logits ", logits.DebugString(), " and targets ",
        targets.DebugString(), ": expected f32[s, b, V/p] and i32[s, b]"));
  }
  const int64_t n = targets.numel(), vp = logits.dim(2);
  const int64_t start = tp_.rank() * vp;
  // Columns [start, start + valid) hold real (unpadded) vocabulary entries.
  const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(vp, vocab_size_ - start));
  const float* l = logits.data<float>();
  LOOM_ASSIGN_OR_RETURN(Tensor max, Tensor::Empty(Shape{n}, core::DType::kF32));
  LOOM_ASSIGN_OR_RETURN(Tensor sums, Tensor::Empty(Shape{2, n}, core::DType::kF32));
  float* m = max.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < valid; ++v) best = std::max(best, l[i * vp + v]);
    m[i] = best;
  }
  if (tp_.parallel()) {
    LOOM_RETURN_IF_ERROR(tp_.comm->AllReduce(max, comm::ReduceOp::kMax)->Wait());
  }
  float* sum = sums.data<float>();
  float* target_logit = sum + n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = TargetAt(targets, i);
    if (t < 0 || t >= vocab_size_) {
      return absl::OutOfRangeError(absl::StrCat("VocabParallelCrossEntropy: target ", t,
                                                " at token ", i, " is outside the vocabulary [0, ",
                                                vocab_size_, ")"));
    }
    double s = 0;
    for (int64_t v = 0; v < valid; ++v) s += std::exp(l[i * vp + v] - m[i]);
    sum[i] = static_cast<float>(s);
    target_logit[i] = (t >= start && t < start + valid) ? l[i * vp + (t - start)] - m[i] : 0.0f;
  }
  if (tp_.parallel()) {
    LOOM_RETURN_IF_ERROR(tp_.comm->AllReduce(sums, comm::ReduceOp::kSum)->Wait());
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += std::log(static_cast<double>(sum[i])) - target_logit[i];
  saved->logits = logits;
  saved->targets = targets;
  saved->max = max;
  LOOM_ASSIGN_OR_RETURN(saved->sum, sums.Narrow(0, 1));
  return n > 0 ? total / n : 0.0;
}

absl::StatusOr<Tensor> VocabParallelCrossEntropy::Backward(const Saved& saved, float dloss) const {
  const Tensor& logits = saved.logits;
  const int64_t n = saved.targets.numel(), vp = logits.dim(2);
  const int64_t start = tp_.rank() * vp;
  const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(vp, vocab_size_ - start));
  LOOM_ASSIGN_OR_RETURN(Tensor d, Tensor::Empty(logits.shape(), core::DType::kF32));
  const float* l = logits.data<float>();
  const float* m = saved.max.data<float>();
  const float* s = saved.sum.data<float>();
  float* g = d.data<float>();
  const float scale = n > 0 ? dloss / static_cast<float>(n) : 0.0f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float inv = 1.0f / s[i];
    for (int64_t v = 0; v < valid; ++v) g[i * vp + v] = std::exp(l[i * vp + v] - m[i]) * inv * scale;
    for (int64_t v = valid; v < vp; ++v) g[i * vp + v] = 0.0f;  // padding
    const int64_t t = TargetAt(saved.targets, i);
    if (t >= start && t < start + valid) g[i * vp + (t - start)] -= scale;
  }
  return d;
}

}  // namespace loom::layers
