#ifndef LOOM_LAYERS_GPT_MODEL_H_
#define LOOM_LAYERS_GPT_MODEL_H_

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/gpt_config.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/params.h"
#include "layers/tp_group.h"
#include "layers/transformer_block.h"
#include "layers/vocab_parallel.h"

namespace loom::layers {

// A contiguous run of layers held by one pipeline stage (a "model chunk";
// interleaved schedules give a stage several). The first chunk of the model
// also embeds the tokens; the last also computes the loss.
struct ChunkSpec {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  bool pre_process = true;   // token + position embedding
  bool post_process = true;  // final LayerNorm, tied output layer, cross-entropy
};

// A GPT-2-style model (token + learned position embeddings, pre-LN blocks,
// final LayerNorm, output layer tied to the token embedding), as the chunks
// one rank holds, tensor-parallel over `tp`. All of the rank's parameters
// live in one ParamBuffer. The whole model on one rank (TP = 1, one chunk)
// is the reference every parallel layout is tested against.
class GptModel {
 public:
  // What one forward of one chunk keeps for its backward (one per in-flight
  // micro-batch).
  struct Saved {
    core::Tensor ids;  // pre_process: [s, b]
    VocabParallelEmbedding::Saved embedding;
    std::vector<TransformerBlock::Saved> blocks;
    LayerNorm::Saved final_norm;
    ColumnParallelLinear::Saved output;
    VocabParallelCrossEntropy::Saved loss;
    int64_t ActivationBytes() const;  // for memory accounting
  };

  // `buffer_multiple`: pad the flat parameter/gradient buffers to a multiple
  // of it (the DP size, for the distributed optimizer's equal shards).
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config, TpGroup tp,
                                                          std::vector<ChunkSpec> chunks,
                                                          int64_t buffer_multiple = 1);
  // The single-chunk, whole-model form.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config, TpGroup tp);

  // Forward of chunk `c`. Input: token ids i32[s, b] for a pre_process chunk,
  // else the hidden state [s(/p), b, h]. Returns the hidden state, or for a
  // post_process chunk an empty tensor with *loss set (mean over tokens;
  // `targets` i32[s, b] is used only there). `loss` may be null: then the
  // loss stays on the device in saved->loss.sums (see LossOf), and the host
  // does not wait for the forward's kernels.
  absl::StatusOr<core::Tensor> Forward(int c, const core::Tensor& input,
                                       const core::Tensor& targets, const DropoutStream& dropout,
                                       Saved* saved, double* loss) const;
  // The mean loss of a post_process forward whose `loss` was null, from its
  // saved->loss.sums (kept by the caller after the Saved is released).
  static absl::StatusOr<double> LossOf(const core::Tensor& loss_sums);
  // Backward of chunk `c`: `dy` is the gradient of its output (ignored for a
  // post_process chunk, which starts from `dloss`, the weight of this
  // micro-batch's mean loss). Returns the gradient of the hidden input, or an
  // empty tensor for a pre_process chunk. Gradients accumulate.
  absl::StatusOr<core::Tensor> Backward(int c, const core::Tensor& dy, float dloss,
                                        const DropoutStream& dropout, const Saved& saved) const;

  // Full logits [s, b, V] (unpadded) of a post_process chunk's last forward,
  // gathered over TP, as f32 on the host: for tests and text generation.
  absl::StatusOr<core::Tensor> GatherLogits(const Saved& saved) const;

  // Under sequence parallelism, all-reduces over TP the gradients of the
  // replicated parameters that saw only s/p rows (LayerNorm, row-parallel
  // bias, position embedding). Call once per step, before the optimizer.
  absl::Status ReduceSequenceParallelGrads();

  // Called after every backward of transformer layer `layer` (global index),
  // once per micro-batch: lets data parallelism start reducing a layer's
  // gradients while earlier layers still run their backward.
  using LayerGradHook = std::function<void(int64_t layer)>;
  void set_layer_grad_hook(LayerGradHook hook) { layer_grad_hook_ = std::move(hook); }
  // [begin, end) of layer `layer`'s parameters in the flat buffers, or
  // {-1, -1} if this rank does not hold it.
  std::pair<int64_t, int64_t> LayerRange(int64_t layer) const;

  const GptConfig& config() const { return config_; }
  const TpGroup& tp() const { return tp_; }
  const std::vector<ChunkSpec>& chunks() const { return chunks_; }
  ParamBuffer& params() { return params_; }
  const ParamBuffer& params() const { return params_; }
  int64_t padded_vocab_size() const { return padded_vocab_; }

 private:
  GptModel(const GptConfig& config, TpGroup tp, std::vector<ChunkSpec> chunks)
      : config_(config), tp_(tp), chunks_(std::move(chunks)) {}

  GptConfig config_;
  TpGroup tp_;
  std::vector<ChunkSpec> chunks_;
  int64_t padded_vocab_ = 0;
  ParamBuffer params_;
  std::vector<std::vector<std::unique_ptr<TransformerBlock>>> blocks_;  // per chunk
  LayerGradHook layer_grad_hook_;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_GPT_MODEL_H_
