#ifndef LOOM_MODELS_GPT_GPT_MODEL_H_
#define LOOM_MODELS_GPT_GPT_MODEL_H_

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/context_parallel.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/params.h"
#include "layers/stage_model.h"
#include "layers/tp_group.h"
#include "layers/vocab_parallel.h"
#include "layers/weight_grad_store.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/transformer_block.h"

namespace loom::layers {

// How the blocks of a chunk run under the config's activation recomputation
// (GptConfig's recompute_* fields, Megatron's semantics): consecutive runs of
// blocks [first, first + count) (indices within the chunk), either recomputed
// (only the run's input is kept; the backward reruns its forward) or not (one
// block that keeps everything). For a chunk of n layers and N =
// --recompute-num-layers:
//   none, selective  n runs of one block, none recomputed (selective happens
//                    inside the attention: AttentionOptions::recompute_core)
//   full, uniform    ceil(n/N) recomputed runs of N blocks (the last one
//                    shorter when N does not divide n)
//   full, block      min(N, n) recomputed runs of one block, then n - N plain ones
struct BlockRun {
  int64_t first = 0;
  int64_t count = 1;
  bool recompute = false;
};
std::vector<BlockRun> RecomputePlan(const GptConfig& config, int64_t num_layers);

// A GPT-2-style model (token + learned position embeddings, pre-LN blocks,
// final LayerNorm, output layer tied to the token embedding), or as the
// config says a Llama-style one (RMSNorm, RoPE and no position table, SwiGLU,
// grouped K/V heads, no linear biases, a separate output layer), as the
// chunks one rank holds, tensor-parallel over `tp`. All of the rank's parameters
// live in one ParamBuffer. The whole model on one rank (TP = 1, one chunk)
// is the reference every parallel layout is tested against.
//
// The model only computes: gradients accumulate into the ParamBuffer and
// every reduction across ranks (data parallel, the sequence-parallel sum over
// TP, the tied embedding across pipeline stages) is GradientSync's.
//
// The GPT family's StageModel (layers/stage_model.h): the pipeline executor,
// the gradient sync and the trainer's timers see only that interface.
class GptModel : public StageModel {
 public:
  // What one forward of one chunk keeps for its backward (one per in-flight
  // micro-batch). Forward and Backward take only a Saved (as their
  // StageModel::Activations).
  struct Saved : StageModel::Activations {
    core::Tensor ids;  // pre_process: [s, b]
    VocabParallelEmbedding::Saved embedding;
    std::vector<TransformerBlock::Saved> blocks;  // empty where a block is recomputed
    // Full recomputation: the input [s(/p), b, h] of each recomputed run, at
    // its first block's index (undefined elsewhere).
    std::vector<core::Tensor> recompute_inputs;
    LayerNorm::Saved final_norm;
    ColumnParallelLinear::Saved output;
    VocabParallelCrossEntropy::Saved loss;
    // Packed documents with a loss mask (PackedDocuments::loss_weight): the
    // weight of each of the chunk's loss rows [s·b] (host f32), and the sums
    // with it as a third row (what DeviceLoss hands to LossOf).
    core::Tensor loss_weight, weighted_sums;
    // Split backward: the weight gradients BackwardInput deferred, per unit,
    // with their operands (the output gradient of each linear layer; with SP
    // the gathered input of each column-parallel one), until BackwardWeight.
    WeightGradStore weight_grads;
    bool weight_grads_pending = false;  // BackwardInput ran, BackwardWeight not yet
    int64_t ActivationBytes() const override;  // for memory accounting
    core::Tensor DeviceLoss() const override {
      return weighted_sums.defined() ? weighted_sums : loss.sums;
    }
  };

  // `buffer_multiple`: pad every parameter's slot in the flat buffers to a
  // multiple of it (the DP size, for the distributed optimizer's equal shards).
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config, TpGroup tp,
                                                          std::vector<ChunkSpec> chunks,
                                                          int64_t buffer_multiple = 1);
  // Context parallel over `cp`: every activation holds this CP rank's two
  // chunks of the sequence (layers/context_parallel.h), the input ids too;
  // the loss is the mean over its tokens (the mean of the CP ranks' losses
  // is the sequence's), and the gradients are partial sums that GradientSync
  // averages over DP x CP.
  // Expert parallel over `ep`: an MoE layer's experts are split over its
  // ranks (this rank's ParamBuffer holds only its own).
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config, TpGroup tp,
                                                          CpGroup cp,
                                                          std::vector<ChunkSpec> chunks,
                                                          int64_t buffer_multiple = 1,
                                                          EpGroup ep = {});
  // The single-chunk, whole-model form.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config, TpGroup tp);

  std::unique_ptr<Activations> NewActivations() const override {
    return std::make_unique<Saved>();
  }
  // Forward of chunk `c`. Input: token ids i32[s, b] for a pre_process chunk,
  // else the hidden state [s(/p), b, h] (s: local_seq_length()). Returns the hidden state, or for a
  // post_process chunk an empty tensor with *loss set (mean over tokens;
  // `targets` i32[s, b] is used only there). `loss` may be null: then the
  // loss stays on the device in saved->loss.sums (see LossOf), and the host
  // does not wait for the forward's kernels. `saved` must be a Saved.
  absl::StatusOr<core::Tensor> Forward(int c, const core::Tensor& input,
                                       const core::Tensor& targets, const DropoutStream& dropout,
                                       Activations* saved, double* loss) override;
  // The mean loss of a post_process forward whose `loss` was null, from its
  // saved->loss.sums (kept by the caller after the Saved is released).
  absl::StatusOr<double> LossOf(const core::Tensor& loss_sums) const override;
  // Backward of chunk `c`: `dy` is the gradient of its output (ignored for a
  // post_process chunk, which starts from `dloss`, the weight of this
  // micro-batch's mean loss; every chunk scales its MoE layers' load-balancing
  // and z losses by it). Returns the gradient of the hidden input, or an
  // empty tensor for a pre_process chunk. Gradients accumulate into params().
  // With full recomputation it first reruns each recomputed run's forward
  // from its kept input with the same `dropout` (same masks: bit-identical to
  // no recomputation), repeating the run's TP collectives; the run's units
  // get their BeforeBackward before it and no forward events.
  // `saved` must be a Saved.
  absl::StatusOr<core::Tensor> Backward(int c, const core::Tensor& dy, float dloss,
                                        const DropoutStream& dropout,
                                        const Activations& saved) override;
  // Split backward (zero-bubble schedules): BackwardInput is Backward with
  // every weight-gradient GEMM (QKV, projection, FC1/FC2 or SwiGLU's, the MoE
  // experts and router, the output layer) and the word table's scatter-add
  // deferred into saved.weight_grads; the norms', the biases not fused into a
  // GEMM and the position table's gradients, the recomputed forward and
  // every TP collective of the input gradient run here. Units get their
  // BeforeBackward here and their AfterBackward in BackwardWeight, which runs
  // the deferred work unit by unit: the same GEMMs on the same operands in
  // the same order, so the gradients are bit-identical to Backward's.
  bool SplitsBackward() const override { return true; }
  absl::StatusOr<core::Tensor> BackwardInput(int c, const core::Tensor& dy, float dloss,
                                             const DropoutStream& dropout,
                                             Activations& saved) override;
  absl::Status BackwardWeight(int c, const DropoutStream& dropout, Activations& saved) override;

  // Full logits [s, b, V] (unpadded) of a post_process chunk's forward into
  // `saved` (a Saved), gathered over TP, as f32 on the host: for tests and
  // text generation.
  absl::StatusOr<core::Tensor> GatherLogits(const Activations& saved) const override;

  // This rank's parameter units, in forward order.
  const std::vector<ParamUnit>& units() const override { return units_; }
  int64_t head_unit() const override { return config_.num_layers; }

  // Handles of the parameters outside the blocks (invalid where this rank
  // does not hold them). With a tied output layer the word embedding of a
  // last stage that does not also hold the first is a tied copy
  // (Param::tied_copy); untied, a last stage holds output_layer() instead and
  // a first stage's word embedding is an ordinary parameter.
  ParamHandle word_embedding() const override { return word_embedding_; }
  ParamHandle position_embedding() const { return position_embedding_; }  // learned_absolute
  ParamHandle output_layer() const { return output_layer_weight_; }      // untied
  // True when the word embedding is also the output layer: its copies on the
  // first and last stage must be summed (GradientSync).
  bool tied_word_embedding() const override { return config_.tied_output_layer(); }

  const GptConfig& config() const { return config_; }
  const TpGroup& tp() const override { return tp_; }
  const CpGroup& cp() const { return cp_; }
  const EpGroup& ep() const { return ep_; }
  // Rows of this rank's sequence before SP: --seq-length / --context-parallel-size.
  int64_t local_seq_length() const override { return config_.seq_length / cp_.size(); }
  // [s/cp (/tp under sequence parallelism), b, h] (as pipeline::BoundaryShape),
  // in the compute dtype, except on the CPU, where --bf16 changes only the
  // GEMMs' operands (layers/linear.h): f32.
  core::Shape BoundaryShape(int64_t micro_batch_size) const override;
  core::DType boundary_dtype() const override;
  core::Device device() const override { return config_.device; }
  const std::vector<ChunkSpec>& chunks() const override { return chunks_; }
  ParamBuffer& params() override { return params_; }
  const ParamBuffer& params() const override { return params_; }
  int64_t padded_vocab_size() const { return padded_vocab_; }

 private:
  GptModel(const GptConfig& config, TpGroup tp, CpGroup cp, EpGroup ep,
           std::vector<ChunkSpec> chunks)
      : config_(config),
        tp_(tp),
        cp_(cp),
        ep_(ep),
        chunks_(std::move(chunks)),
        loss_(tp, config.vocab_size) {}
  absl::Status BuildLayers();
  // Packed documents' loss mask: fills saved->loss_weight and weighted_sums
  // from documents->loss_weight (nothing without one).
  absl::Status WeighLoss(const PackedDocuments* documents, Saved* saved) const;
  // Backward of chunk `c`; `defer` non-null: BackwardInput's, deferring the
  // weight gradients and the units' AfterBackward into it.
  absl::StatusOr<core::Tensor> BackwardChunk(int c, const core::Tensor& dy, float dloss,
                                             const DropoutStream& dropout, const Saved& saved,
                                             WeightGradStore* defer);
  // A unit's backward is done at this point of the input-gradient pass:
  // notify AfterBackward now, or close its deferred work in `defer`.
  absl::Status UnitBackwardDone(int64_t unit, WeightGradStore* defer) const;

  GptConfig config_;
  TpGroup tp_;
  CpGroup cp_;
  EpGroup ep_;
  std::vector<ChunkSpec> chunks_;
  int64_t padded_vocab_ = 0;
  ParamBuffer params_;
  ParamHandle word_embedding_, position_embedding_, output_layer_weight_;
  bool has_pre_ = false;
  // The layers hold pointers into params_; they exist where a chunk needs them.
  std::optional<VocabParallelEmbedding> embedding_;       // pre_process
  std::vector<std::vector<std::unique_ptr<TransformerBlock>>> blocks_;  // per chunk
  std::vector<std::vector<BlockRun>> runs_;                             // per chunk
  std::optional<LayerNorm> final_norm_;                    // post_process
  std::optional<ColumnParallelLinear> output_layer_;       // post_process
  VocabParallelCrossEntropy loss_;
  std::vector<ParamUnit> units_;
};

}  // namespace loom::layers

#endif  // LOOM_MODELS_GPT_GPT_MODEL_H_
