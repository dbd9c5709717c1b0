#ifndef LOOM_LAYERS_VOCAB_PARALLEL_H_
#define LOOM_LAYERS_VOCAB_PARALLEL_H_

// The vocabulary split over TP: embedding rows [V/p, h] per rank, and the
// cross-entropy computed on logits split over the vocabulary without ever
// gathering them.

#include "absl/status/statusor.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "layers/params.h"
#include "layers/tp_group.h"

namespace loom::layers {

// The vocabulary padded to a multiple of (divisible_by · tp), as Megatron's
// --make-vocab-size-divisible-by. Padding rows are never looked up, and the
// cross-entropy masks their logits, so padding (and thus TP) does not change
// the model's function.
int64_t PaddedVocabSize(int64_t vocab_size, int64_t divisible_by, int tp_size);

// Token embedding with the table split by vocabulary rows. Each rank looks up
// the ids it owns (zeros elsewhere), then the partial rows are all-reduced
// (no SP) or reduce-scattered along s (SP).
class VocabParallelEmbedding {
 public:
  struct Saved {
    core::Tensor ids;  // [s, b] (all of the sequence; the backward needs every id)
  };
  VocabParallelEmbedding(Param* weight, TpGroup tp) : w_(weight), tp_(tp) {}

  // ids: i32[s, b] -> [s, b, h], or [s/p, b, h] with SP.
  absl::StatusOr<core::Tensor> Forward(const core::Tensor& ids, Saved* saved) const;
  // dy: [s(/p), b, h]; accumulates the table gradient.
  absl::Status Backward(const core::Tensor& dy, const Saved& saved) const;

 private:
  Param* w_;
  TpGroup tp_;
};

// Cross-entropy over vocabulary-split logits (docs/PARALLELISM.md):
// all-reduce(MAX) of the row maxima, then one all-reduce(SUM) carrying both
// the sum of exponentials and the target logit. Backward needs no
// communication. Columns at or beyond `vocab_size` (padding) are masked.
class VocabParallelCrossEntropy {
 public:
  struct Saved {
    core::Tensor logits;   // [s, b, V/p]
    core::Tensor targets;  // [s, b]
    core::Tensor max;      // [s·b] global row max
    core::Tensor sums;     // [2, s·b]: Σ exp(logit - max), then the target logit - max
  };
  VocabParallelCrossEntropy(TpGroup tp, int64_t vocab_size) : tp_(tp), vocab_size_(vocab_size) {}

  // Returns the mean loss over the s·b tokens (identical on every TP rank).
  // Reads it back to the host: ForwardOnDevice + MeanLoss.
  absl::StatusOr<double> Forward(const core::Tensor& logits, const core::Tensor& targets,
                                 Saved* saved) const;
  // The forward without reading the loss back: on a GPU the host does not
  // wait for the kernels. saved->sums holds what MeanLoss needs.
  absl::Status ForwardOnDevice(const core::Tensor& logits, const core::Tensor& targets,
                               Saved* saved) const;
  // The mean loss from Saved::sums (a copy to the host, which waits for the
  // kernels that produce it). A third row [3, n] weighs each token's loss
  // (packed documents' loss mask): sum_i w_i loss_i / n.
  static absl::StatusOr<double> MeanLoss(const core::Tensor& sums);
  // dlogits = (softmax - onehot) · dloss / (s·b), written into a new tensor.
  absl::StatusOr<core::Tensor> Backward(const Saved& saved, float dloss) const;

 private:
  // ForwardOnDevice's "online" implementation (core/ops/kernel_manifest:
  // cross_entropy): one read of the logits for the local max and sums, then
  // the same all-reduces with the sums rescaled to the global max between.
  absl::Status ForwardOnline(const core::Tensor& logits, const core::Tensor& targets,
                             const core::ops::VocabShard& shard, Saved* saved) const;
  // This rank's vocabulary columns, for `local_vocab` logits per row.
  core::ops::VocabShard Shard(int64_t local_vocab) const;
  TpGroup tp_;
  int64_t vocab_size_;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_VOCAB_PARALLEL_H_
