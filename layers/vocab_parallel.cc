#include "layers/vocab_parallel.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/ops.h"
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
  core::ops::EmbeddingOptions opts;
  opts.vocab_start = w_->split_start;
  opts.zero_out_of_range = true;
  LOOM_ASSIGN_OR_RETURN(Tensor partial,
                        Tensor::Empty(Shape{ids.dim(0), ids.dim(1), h}, w_->value.dtype(), w_->value.device()));
  LOOM_RETURN_IF_ERROR(core::ops::EmbeddingForward(ids, w_->value, &partial, opts));
  if (tp_.sequence_parallel) return ReduceScatterSeq(tp_, partial);
  LOOM_RETURN_IF_ERROR(AllReduceTp(tp_, partial));
  return partial;
}

absl::Status VocabParallelEmbedding::Backward(const Tensor& dy, const Saved& saved) const {
  Tensor full = dy;
  if (tp_.sequence_parallel) {
    LOOM_ASSIGN_OR_RETURN(full, AllGatherSeq(tp_, dy));
  }
  core::ops::EmbeddingOptions opts;
  opts.vocab_start = w_->split_start;
  opts.zero_out_of_range = true;
  return core::ops::EmbeddingBackward(saved.ids, full, &w_->grad, opts);
}

// -------------------------------------------------------------- cross-entropy

core::ops::VocabShard VocabParallelCrossEntropy::Shard(int64_t local_vocab) const {
  // Columns [start, start + valid) hold real (unpadded) vocabulary entries.
  const int64_t start = tp_.rank() * local_vocab;
  const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(local_vocab, vocab_size_ - start));
  return core::ops::VocabShard{start, valid, vocab_size_};
}

absl::StatusOr<double> VocabParallelCrossEntropy::Forward(const Tensor& logits,
                                                          const Tensor& targets,
                                                          Saved* saved) const {
  LOOM_RETURN_IF_ERROR(ForwardOnDevice(logits, targets, saved));
  return MeanLoss(saved->sums);
}

absl::StatusOr<double> VocabParallelCrossEntropy::MeanLoss(const Tensor& sums) {
  if (sums.rank() != 2 || (sums.dim(0) != 2 && sums.dim(0) != 3) ||
      sums.dtype() != core::DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("VocabParallelCrossEntropy::MeanLoss: ",
                                                   sums.DebugString(),
                                                   ", expected f32[2, n] or [3, n]"));
  }
  const int64_t n = sums.dim(1);
  LOOM_ASSIGN_OR_RETURN(Tensor host, sums.To(core::Device::CPU()));
  const float* sum = host.data<float>();
  const float* target_logit = sum + n;
  const float* weight = sums.dim(0) == 3 ? sum + 2 * n : nullptr;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double loss = std::log(static_cast<double>(sum[i])) - target_logit[i];
    total += weight == nullptr ? loss : (weight[i] == 0.0f ? 0.0 : weight[i] * loss);
  }
  return n > 0 ? total / n : 0.0;
}

absl::Status VocabParallelCrossEntropy::ForwardOnDevice(const Tensor& logits,
                                                        const Tensor& targets,
                                                        Saved* saved) const {
  if (logits.rank() != 3 || targets.rank() != 2 || logits.dim(0) != targets.dim(0) ||
      logits.dim(1) != targets.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "VocabParallelCrossEntropy: logits ", logits.DebugString(), " and targets ",
        targets.DebugString(), ": expected f32[s, b, V/p] and i32[s, b]"));
  }
  const int64_t n = targets.numel();
  const core::ops::VocabShard shard = Shard(logits.dim(2));
  LOOM_ASSIGN_OR_RETURN(const core::ops::KernelChoice choice,
                        core::ops::ChooseKernel("cross_entropy", logits.device().type));
  if (choice.implementation == "online") return ForwardOnline(logits, targets, shard, saved);
  LOOM_ASSIGN_OR_RETURN(Tensor max, Tensor::Empty(Shape{n}, core::DType::kF32, logits.device()));
  LOOM_RETURN_IF_ERROR(core::ops::VocabShardRowMax(logits, shard, &max));
  if (tp_.parallel()) {
    LOOM_RETURN_IF_ERROR(tp_.comm->AllReduce(max, comm::ReduceOp::kMax)->WaitOnStream());
  }
  LOOM_ASSIGN_OR_RETURN(Tensor sums,
                        Tensor::Empty(Shape{2, n}, core::DType::kF32, logits.device()));
  LOOM_RETURN_IF_ERROR(core::ops::VocabShardSumExp(logits, targets, max, shard, &sums));
  if (tp_.parallel()) {
    LOOM_RETURN_IF_ERROR(tp_.comm->AllReduce(sums, comm::ReduceOp::kSum)->WaitOnStream());
  }
  saved->logits = logits;
  saved->targets = targets;
  saved->max = max;
  saved->sums = sums;
  return absl::OkStatus();
}

absl::Status VocabParallelCrossEntropy::ForwardOnline(const Tensor& logits, const Tensor& targets,
                                                      const core::ops::VocabShard& shard,
                                                      Saved* saved) const {
  const int64_t n = targets.numel();
  // This shard's max and sums against it, from one read of the logits.
  LOOM_ASSIGN_OR_RETURN(Tensor local_max,
                        Tensor::Empty(Shape{n}, core::DType::kF32, logits.device()));
  LOOM_ASSIGN_OR_RETURN(Tensor sums,
                        Tensor::Empty(Shape{2, n}, core::DType::kF32, logits.device()));
  LOOM_RETURN_IF_ERROR(
      core::ops::VocabShardRowMaxSumExp(logits, targets, shard, &local_max, &sums));
  Tensor max = local_max;  // TP 1: the local max is the global one
  if (tp_.parallel()) {
    // The same two all-reduces as the unfused path; between them each
    // shard's sums move to the global max (the local one is still needed).
    LOOM_ASSIGN_OR_RETURN(max, Tensor::Empty(Shape{n}, core::DType::kF32, logits.device()));
    LOOM_RETURN_IF_ERROR(core::ops::Copy(local_max, &max));
    LOOM_RETURN_IF_ERROR(tp_.comm->AllReduce(max, comm::ReduceOp::kMax)->WaitOnStream());
    LOOM_RETURN_IF_ERROR(
        core::ops::VocabShardRescaleSums(logits, targets, local_max, max, shard, &sums));
    LOOM_RETURN_IF_ERROR(tp_.comm->AllReduce(sums, comm::ReduceOp::kSum)->WaitOnStream());
  }
  saved->logits = logits;
  saved->targets = targets;
  saved->max = max;
  saved->sums = sums;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> VocabParallelCrossEntropy::Backward(const Saved& saved, float dloss) const {
  const Tensor& logits = saved.logits;
  const int64_t n = saved.targets.numel();
  LOOM_ASSIGN_OR_RETURN(Tensor d, Tensor::Empty(logits.shape(), logits.dtype(), logits.device()));
  LOOM_ASSIGN_OR_RETURN(Tensor sum_row, saved.sums.Narrow(0, 1));  // Σ exp per row
  LOOM_ASSIGN_OR_RETURN(Tensor sum, sum_row.Reshape(Shape{n}));
  const float scale = n > 0 ? dloss / static_cast<float>(n) : 0.0f;
  LOOM_RETURN_IF_ERROR(core::ops::VocabShardCrossEntropyBackward(
      logits, saved.targets, saved.max, sum, Shard(logits.dim(2)), scale, &d));
  return d;
}

}  // namespace loom::layers
