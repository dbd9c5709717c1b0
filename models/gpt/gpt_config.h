#ifndef LOOM_MODELS_GPT_GPT_CONFIG_H_
#define LOOM_MODELS_GPT_GPT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "layers/params.h"
#include "models/gpt/gpt_architecture.h"

namespace loom::layers {

// --moe-router-load-balancing-type (Megatron's aux_loss and none; Loom has
// no sinkhorn or seq_aux_loss).
enum class MoeLoadBalancing { kAuxLoss, kNone };
LOOM_ENUM_NAMES(MoeLoadBalancing, {MoeLoadBalancing::kAuxLoss, "aux_loss"},
                {MoeLoadBalancing::kNone, "none"})
// --recompute-granularity: none ("", Megatron's unset) | full | selective.
enum class RecomputeGranularity { kNone, kFull, kSelective };
LOOM_ENUM_NAMES(RecomputeGranularity, {RecomputeGranularity::kNone, ""},
                {RecomputeGranularity::kFull, "full"},
                {RecomputeGranularity::kSelective, "selective"})
// --recompute-method (with full): none ("", unset) | uniform | block.
enum class RecomputeMethod { kNone, kUniform, kBlock };
LOOM_ENUM_NAMES(RecomputeMethod, {RecomputeMethod::kNone, ""}, {RecomputeMethod::kUniform, "uniform"},
                {RecomputeMethod::kBlock, "block"})

// The model: its architecture (models/gpt/gpt_architecture.h: the fields a
// checkpoint saves and compares, each declared once there) and how it runs
// here (initialisation, placement, recomputation, MoE execution), named after
// Megatron's flags.
struct GptConfig : GptArchitecture {
  float init_method_std = 0.02f;           // --init-method-std
  uint64_t seed = 1234;                    // --seed
  // Where the parameters and activations live (--device) and the dtype the
  // layers compute in (--bf16: bf16 weights and activations; the optimizer
  // keeps f32 master weights and f32 gradients either way).
  core::Device device = core::Device::CPU();
  core::DType compute_dtype = core::DType::kF32;

  // Activation recomputation (Megatron's flags; the model is the same, only
  // what a forward keeps for its backward changes, and the result is bit-exact).
  //   --recompute-granularity: "" (none) | full | selective. selective: every
  //     layer keeps the attention core's input (qkv) and the backward reruns
  //     the core (softmax, dropout, P·V) to get back what it dropped.
  //   --recompute-method (full only): uniform: each chunk's layers in groups
  //     of --recompute-num-layers N (the last group shorter when N does not
  //     divide them), only each group's input kept, the group's forward rerun
  //     in its backward; block: the first N layers of each chunk rerun (their
  //     inputs kept), the rest keep everything.
  //   --recompute-num-layers: N, 1 .. layers per (virtual pipeline) chunk with
  //     full; 0 (unset) otherwise.
  RecomputeGranularity recompute_granularity = RecomputeGranularity::kNone;
  RecomputeMethod recompute_method = RecomputeMethod::kNone;
  int64_t recompute_num_layers = 0;

  // Mixture of experts (Megatron's flags; layers/moe.h). 0 experts: dense.
  //   --num-experts E, --moe-router-topk K: each token goes to the K experts
  //     of largest router logit, weighted by the softmax over those K logits.
  //   --moe-layer-freq N: layer l is an MoE layer when l % N == 0 (1: all).
  //   --moe-router-load-balancing-type aux_loss | none, --moe-aux-loss-coeff,
  //     --moe-z-loss-coeff: the Switch load-balancing loss and ST-MoE's
  //     z-loss, added to the objective (not to the logged LM loss).
  //   --moe-expert-capacity-factor C (0: dropless): an expert takes at most
  //     ceil(tokens · K / E · C) assignments, the most probable ones;
  //     --moe-pad-expert-input-to-capacity pads every expert to that many rows.
  // (--num-experts, --moe-router-topk and --moe-layer-freq are architecture.)
  MoeLoadBalancing moe_router_load_balancing_type = MoeLoadBalancing::kAuxLoss;
  float moe_aux_loss_coeff = 0.0f;
  float moe_z_loss_coeff = 0.0f;
  float moe_expert_capacity_factor = 0.0f;
  bool moe_pad_expert_input_to_capacity = false;
  // --moe-grouped-gemm: all experts' GEMMs at once, an expert per thread,
  // instead of one expert after the other (same numbers).
  bool moe_grouped_gemm = false;
  // --moe-a2a-overlap-chunks N (1: off): under expert parallelism the MoE
  // layer splits its micro-batch's tokens into N chunks (along the flattened
  // [s, b] order) and pipelines them, forward and backward: while chunk k's
  // experts compute, chunk k+1's dispatch all-to-all and chunk k-1's combine
  // all-to-all are in flight (Tutel's a2a_ffn_overlap_degree; not Megatron's
  // --overlap-moe-expert-parallel-comm, which overlaps another micro-batch's
  // compute). Routing, capacity and the aux/z losses stay the whole
  // micro-batch's (bit-identical to N = 1); outputs and gradients equal
  // N = 1's within a GEMM's rounding. No effect without expert parallelism.
  int64_t moe_a2a_overlap_chunks = 1;

  // Whether the model allocates its own flat f32 gradient buffer. Under
  // ZeRO-2 (--data-parallel-sharding-strategy=optim_grads) //distributed owns
  // the gradient storage and binds a bucket buffer per backward: the model is
  // built without one, so a full-size buffer never exists (not even at setup).
  bool allocate_gradients = true;
  // ZeRO-3 (optim_grads_params): //distributed keeps the owned shard of the
  // parameters and binds each unit's gathered values: no full-size buffer.
  bool allocate_parameters = true;

  bool recompute_full() const { return recompute_granularity == RecomputeGranularity::kFull; }
  bool recompute_selective() const {
    return recompute_granularity == RecomputeGranularity::kSelective;
  }
};

// Checks that the model can be laid out over tp x pp (x vp chunks per stage)
// x cp (context parallelism: 2 sequence chunks per CP rank), with or without
// sequence parallelism (over each CP rank's s / cp rows), before any work
// starts. Errors name the flags and the two numbers that do not divide. Also
// checks the recomputation flags (ValidateRecompute) against the layers per
// chunk.
absl::Status ValidateLayout(const GptConfig& config, int tp, bool sequence_parallel, int pp = 1,
                            int vp = 1, int cp = 1);

// The MoE flags (--num-experts and the --moe-* ones): ranges, top-k <= E,
// no linear biases, a known load-balancing type; the errors name the flags.
absl::Status ValidateMoe(const GptConfig& config);

// The --recompute-* flags: a known granularity and method, a method and
// N in [1, layers_per_chunk] with full, neither with selective (Megatron's
// rules). Errors name the flags.
absl::Status ValidateRecompute(const GptConfig& config, int64_t layers_per_chunk);

// The global, layout-independent names of the parameters outside the blocks:
// spelled here only (checkpoints store tensors by these names). Code that
// needs one of them at run time holds a ParamHandle (see GptModel).
inline constexpr char kWordEmbeddingName[] = "embedding.word_embeddings.weight";
inline constexpr char kPositionEmbeddingName[] = "embedding.position_embeddings.weight";
inline constexpr char kFinalNormWeightName[] = "final_layernorm.weight";
inline constexpr char kFinalNormBiasName[] = "final_layernorm.bias";
inline constexpr char kOutputLayerName[] = "output_layer.weight";

// Every parameter's global name, shape and layout (h hidden, H heads, G query
// groups (H without GQA), n = H/G, d = h/H head dim, F = ffn(), V vocabulary,
// P max positions). A tensor split over TP is cut into p contiguous blocks of
// its split dim (TpSplit); checkpoints store and reshard exactly these.
//
//   embedding.word_embeddings.weight     [V, h]  rows split (vocab-parallel)
//   embedding.position_embeddings.weight [P, h]  replicated; learned_absolute only
//   layers.i.input_layernorm.weight      [h]     replicated (LayerNorm and RMSNorm)
//   layers.i.input_layernorm.bias        [h]     LayerNorm only
//   layers.i.attention.qkv.weight        [(H + 2G)·d, h]  rows split; rows ordered
//       [group g, {q of heads g·n … g·n+n-1, k, v}, d]: a TP rank's block is whole
//       query groups with their query heads. Without GQA (G = H) that is
//       [head, {q, k, v}, d], GPT-2's layout. HF Llama: q_proj row (j·d + e) is
//       row ((j/n)·(n+2) + j%n)·d + e; k_proj / v_proj row (g·d + e) is row
//       (g·(n+2) + n)·d + e / (g·(n+2) + n+1)·d + e (rotate-half RoPE, HF's
//       convention, so no permutation of q/k rows).
//   layers.i.attention.qkv.bias          [(H + 2G)·d]  same order; unless --disable-bias-linear
//       without --add-qkv-bias (HF Qwen2: q/k/v_proj.bias, rows as their weights')
//   layers.i.attention.dense.weight      [h, H·d]  columns split (o_proj)
//   layers.i.attention.dense.bias        [h]     replicated; unless --disable-bias-linear
//   layers.i.post_attention_layernorm.*  as input_layernorm
//   layers.i.mlp.dense_h_to_4h.weight    GELU: [F, h] rows split (c_fc).
//       --swiglu: [2, F·h] columns split: row 0 is the gate projection [F, h]
//       (gate_proj), row 1 the up projection [F, h] (up_proj), each flattened
//       row-major. A TP rank's column block is rows [r·F/p, (r+1)·F/p) of both,
//       which it holds as the [2F/p, h] matrix [gate_shard; up_shard]
//       (Megatron's split of the fused gate/up weight).
//   layers.i.mlp.dense_h_to_4h.bias      GELU: [F] rows split; --swiglu: [2, F]
//       columns split (gate bias, up bias); unless --disable-bias-linear
//   layers.i.mlp.dense_4h_to_h.weight    [h, F]  columns split (down_proj)
//   layers.i.mlp.dense_4h_to_h.bias      [h]     replicated; unless --disable-bias-linear
//   final_layernorm.weight / .bias       [h]     as input_layernorm (HF Llama: norm)
//   output_layer.weight                  [V, h]  rows split (vocab-parallel), on the
//       last stage; only with --untie-embeddings-and-output-weights (HF: lm_head),
//       else the output layer is the word embedding (tied)
// V rows are padded for TP (make_vocab_size_divisible_by · p) in memory,
// stored unpadded (ParamSpec::unpadded_rows).

// The global names of layer `layer`'s parameters, as listed above: spelled
// here only. BlockParamSpecs names the specs with them, the layers find
// their parameters by them, and the Hugging Face table
// (models/gpt/hf_tensor_map.cc) maps them.
struct BlockParamNames {
  explicit BlockParamNames(int64_t layer);
  std::string input_norm_weight, input_norm_bias;      // layers.i.input_layernorm.*
  std::string qkv_weight, qkv_bias;                    // layers.i.attention.qkv.*
  std::string dense_weight, dense_bias;                // layers.i.attention.dense.*
  std::string post_norm_weight, post_norm_bias;        // layers.i.post_attention_layernorm.*
  std::string fc1_weight, fc1_bias;                    // layers.i.mlp.dense_h_to_4h.*
  std::string fc2_weight, fc2_bias;                    // layers.i.mlp.dense_4h_to_h.*
  std::string router_weight;                           // layers.i.mlp.router.weight (MoE)
  // An MoE layer's expert e: layers.i.mlp.experts.e.dense_h_to_4h / dense_4h_to_h.weight.
  std::string expert_fc1_weight(int64_t e) const;
  std::string expert_fc2_weight(int64_t e) const;

 private:
  std::string prefix_;  // "layers.i."
};

// The three projections stacked in `attention.qkv.weight` (and its bias).
enum class QkvPart { kQuery, kKey, kValue };
// The global row of `attention.qkv.weight` that holds row `e` (< head_dim) of
// query head `head` (kQuery) or of the key/value head of query group `head`:
// the [group, {q of its heads, k, v}, d] order documented above (GPT-2's
// [head, {q, k, v}, d] without GQA). Import and export map HF's q/k/v_proj
// rows through it.
int64_t QkvWeightRow(const GptConfig& c, QkvPart part, int64_t head, int64_t e);

// Global parameter specs of layer `layer` (pre-norm transformer block), of
// an MoE layer the experts `experts` holds (layers/params.h).
std::vector<ParamSpec> BlockParamSpecs(const GptConfig& config, int64_t layer,
                                       const ExpertShard& experts = {});
// Token embedding, and the position table with learned_absolute positions
// (the token table is also the output layer unless untied).
std::vector<ParamSpec> EmbeddingParamSpecs(const GptConfig& config, int tp);
std::vector<ParamSpec> FinalNormParamSpecs(const GptConfig& config);
// The untied output layer (empty when it is tied to the word embedding).
std::vector<ParamSpec> OutputLayerParamSpecs(const GptConfig& config, int tp);

// Every parameter of the model at TP 1, in forward order (embeddings, blocks,
// final norm, output layer): what a checkpoint of it stores.
std::vector<ParamSpec> ModelParamSpecs(const GptConfig& config);

// Global parameter count of the model (unpadded vocabulary), for MFU.
int64_t ParameterCount(const GptConfig& config);
// The parameters one token's forward multiplies with: ParameterCount less,
// in every MoE layer, the E - topk experts the token is not sent to (what
// model FLOPs count).
int64_t ActiveParameterCount(const GptConfig& config);

}  // namespace loom::layers

#endif  // LOOM_MODELS_GPT_GPT_CONFIG_H_
