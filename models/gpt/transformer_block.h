#ifndef LOOM_MODELS_GPT_TRANSFORMER_BLOCK_H_
#define LOOM_MODELS_GPT_TRANSFORMER_BLOCK_H_

#include <optional>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/context_parallel.h"
#include "layers/layer_norm.h"
#include "layers/moe.h"
#include "layers/params.h"
#include "layers/tp_group.h"
#include "models/gpt/gpt_config.h"

namespace loom::layers {

// A pre-norm block (GPT-2, or Llama-style with RMSNorm, RoPE, SwiGLU, GQA
// and no biases, as the config says):
//   h1  = x + dropout(attention(LN1(x)))
//   out = h1 + dropout(mlp(LN2(h1)))
// on activations [s, b, h] ([s/p, b, h] under sequence parallelism; under
// context parallelism s is this CP rank's 2 chunks, s / cp rows).
//
// Forward is a pure function of (x, parameters, dropout stream): every
// dropout mask is drawn at (seed, DropoutSite(stream, layer, site), global
// index), so running it again on the same x gives bit-identical activations
// and Saved. That is what activation recomputation relies on: GptModel's
// full recomputation reruns whole blocks in the backward, and selective
// recomputation (AttentionOptions::recompute_core) reruns the attention core.
class TransformerBlock {
 public:
  // A norm's parameters, for the fused residual_norm ops (beta null: RMSNorm).
  struct NormParams {
    Param* gamma;
    Param* beta;
    float eps;
  };
  struct Saved {
    LayerNorm::Saved ln1;  // holds x
    ParallelAttention::Saved attention;
    LayerNorm::Saved ln2;  // holds h1
    ParallelMlp::Saved mlp;  // a dense layer's
    MoeMlp::Saved moe;       // an MoE layer's (GptConfig::moe_layer)
  };
  // `ep`: the expert-parallel group of an MoE layer (this rank's params hold
  // only its experts, BlockParamSpecs(config, layer, ep.shard())).
  TransformerBlock(ParamBuffer* params, const GptConfig& config, int64_t layer, TpGroup tp,
                   CpGroup cp = {}, EpGroup ep = {});

  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, const DropoutStream& dropout,
                                       Saved* saved) const;
  // `loss_weight`: this micro-batch's weight in the objective (an MoE layer's
  // load-balancing and z losses are scaled by it).
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const DropoutStream& dropout,
                                        const Saved& saved, float loss_weight = 1.0f) const;

 private:
  // Finds the parameters by their names (gpt_config.h's BlockParamNames).
  TransformerBlock(ParamBuffer* params, const GptConfig& config, int64_t layer,
                   const BlockParamNames& names, TpGroup tp, CpGroup cp, EpGroup ep);
  absl::Status Dropout(core::Tensor* x, const DropoutStream& d, int site, bool backward) const;

  // ChooseKernel("residual_norm", device) picked "fused".
  absl::StatusOr<bool> Fused(const core::Tensor& t) const;
  // branch (in place) = x + dropout(branch) at `site` (site < 0: no dropout);
  // returns norm(branch), saving what LayerNorm::Forward saves.
  absl::StatusOr<core::Tensor> ResidualNormForward(const core::Tensor& x, core::Tensor* branch,
                                                   const DropoutStream& d, int site,
                                                   const NormParams& norm,
                                                   LayerNorm::Saved* saved) const;
  // dx = norm'(dout) + dresid; with dbranch (non-null) also dropout'(dx) at `site`.
  absl::Status ResidualNormBackward(const core::Tensor& dout, const core::Tensor& dresid,
                                    const DropoutStream& d, int site, const NormParams& norm,
                                    const LayerNorm::Saved& saved, core::Tensor* dx,
                                    core::Tensor* dbranch) const;

  int64_t layer_;
  TpGroup tp_;
  CpGroup cp_;
  LayerNorm ln1_, ln2_;
  NormParams ln1_params_, ln2_params_;
  ParallelAttention attention_;
  std::optional<ParallelMlp> mlp_;  // dense layers
  std::optional<MoeMlp> moe_;       // MoE layers
};

// The attention variant the config asks for (with
// --recompute-granularity=selective: the attention core recomputed in the
// backward, AttentionOptions::recompute_core).
AttentionOptions AttentionOptionsOf(const GptConfig& config);

// Hidden dropout on an activation [s(/p), b, h] in place, its mask taken at the
// rows' places in the global [s, b, h] (SP: this rank's block of rows; CP:
// at the global positions of its chunks, GlobalRowRuns).
absl::Status HiddenDropout(core::Tensor* x, const DropoutStream& d, uint64_t site_stream,
                           const TpGroup& tp, const CpGroup& cp, bool backward);

}  // namespace loom::layers

#endif  // LOOM_MODELS_GPT_TRANSFORMER_BLOCK_H_
