#include "models/gpt/gpt_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/enum_names.h"
#include "core/status_macros.h"
#include "layers/vocab_parallel.h"

namespace loom::layers {
namespace {

absl::Status NotDivisible(const std::string& what, int64_t a, const std::string& by, int64_t b) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " (", a, ") is not divisible by ", by, " (", b, ")"));
}

ParamSpec Spec(std::string name, core::Shape shape, TpSplit split, Init init, float std,
               bool decay, bool sp_grad = false) {
  ParamSpec s;
  s.name = std::move(name);
  s.global_shape = shape;
  s.split = split;
  s.init = init;
  s.std = std;
  s.weight_decay = decay;
  s.sequence_parallel_grad = sp_grad;
  return s;
}

}  // namespace

absl::Status ValidateLayout(const GptConfig& c, int tp, bool sp, int pp, int vp, int cp) {
  if (tp < 1 || pp < 1 || vp < 1 || cp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-model-parallel-size (", tp, "), --pipeline-model-parallel-size (", pp,
        "), --context-parallel-size (", cp, ") and the virtual pipeline size (", vp,
        ") must be >= 1"));
  }
  if (c.num_layers < 1 || c.hidden_size < 1 || c.num_attention_heads < 1 || c.seq_length < 1 ||
      c.vocab_size < 1) {
    return absl::InvalidArgumentError(
        "--num-layers, --hidden-size, --num-attention-heads, --seq-length and the vocabulary "
        "size must all be >= 1");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return NotDivisible("--hidden-size", c.hidden_size, "--num-attention-heads",
                        c.num_attention_heads);
  }
  if (!(c.layernorm_epsilon > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--norm-epsilon (", c.layernorm_epsilon, ") must be > 0"));
  }
  if (c.rope()) {
    if (!(c.rotary_base > 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rotary-base (", c.rotary_base, ") must be > 1"));
    }
    if (!(c.rotary_percent > 0 && c.rotary_percent <= 1) || c.rotary_dim() < 2 ||
        c.rotary_dim() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rotary-percent (", c.rotary_percent, ") x head dim (--hidden-size / "
          "--num-attention-heads = ", c.head_dim(), ") must give an even number of rotated "
          "dims >= 2 (got ", c.rotary_dim(), ")"));
    }
  }
  if (c.group_query_attention) {
    if (c.num_query_groups < 1 || c.num_query_groups > c.num_attention_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num-query-groups (", c.num_query_groups, ") must lie in [1, --num-attention-heads (",
          c.num_attention_heads, ")]"));
    }
    if (c.num_attention_heads % c.num_query_groups != 0) {
      return NotDivisible("--num-attention-heads", c.num_attention_heads, "--num-query-groups",
                          c.num_query_groups);
    }
    // TP splits query groups (each with its query heads): checked before the
    // head count, which it implies.
    if (c.num_query_groups % tp != 0) {
      return NotDivisible("--num-query-groups", c.num_query_groups,
                          "--tensor-model-parallel-size", tp);
    }
  }
  if (c.ffn() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ffn-hidden-size is 0 and --swiglu's default int(4 x --hidden-size (", c.hidden_size,
        ") x 2/3 / 64) x 64 is 0: set --ffn-hidden-size"));
  }
  if (c.num_attention_heads % tp != 0) {
    return NotDivisible("--num-attention-heads", c.num_attention_heads,
                        "--tensor-model-parallel-size", tp);
  }
  if (c.ffn() % tp != 0) {
    return NotDivisible("--ffn-hidden-size", c.ffn(), "--tensor-model-parallel-size", tp);
  }
  if (c.hidden_size % tp != 0) {
    return NotDivisible("--hidden-size", c.hidden_size, "--tensor-model-parallel-size", tp);
  }
  if (c.make_vocab_size_divisible_by < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--make-vocab-size-divisible-by (",
                                                   c.make_vocab_size_divisible_by,
                                                   ") must be >= 1"));
  }
  if (cp > 1 && c.seq_length % (2 * cp) != 0) {
    return NotDivisible("--seq-length", c.seq_length,
                        "2 x --context-parallel-size (2 chunks per CP rank)", 2 * cp);
  }
  if (sp && (c.seq_length / cp) % tp != 0) {
    return NotDivisible(cp > 1 ? "--seq-length / --context-parallel-size" : "--seq-length",
                        c.seq_length / cp,
                        "--tensor-model-parallel-size under --sequence-parallel", tp);
  }
  if (c.num_layers % (pp * vp) != 0) {
    return NotDivisible("--num-layers", c.num_layers,
                        "--pipeline-model-parallel-size x virtual stages", pp * vp);
  }
  if (c.max_positions() < c.seq_length) {
    return absl::InvalidArgumentError(absl::StrCat("--max-position-embeddings (",
                                                   c.max_positions(), ") is below --seq-length (",
                                                   c.seq_length, ")"));
  }
  if (cp > 1 && c.moe() && c.moe_expert_capacity_factor > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-expert-capacity-factor (", c.moe_expert_capacity_factor,
        ") with --context-parallel-size > 1 is not supported: each CP rank would drop from its "
        "own share of the sequence, unlike --context-parallel-size=1 (MoE with CP is dropless)"));
  }
  LOOM_RETURN_IF_ERROR(ValidateMoe(c));
  return ValidateRecompute(c, c.num_layers / (pp * vp));
}

absl::Status ValidateMoe(const GptConfig& c) {
  if (c.num_experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-experts (", c.num_experts, ") must be >= 0 (0: dense MLPs)"));
  }
  if (c.moe_a2a_overlap_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-a2a-overlap-chunks (", c.moe_a2a_overlap_chunks,
        ") must be >= 1 (1: every expert all-to-all waited on as it is issued)"));
  }
  if (c.moe_a2a_overlap_chunks > 1 && !c.moe()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-a2a-overlap-chunks (", c.moe_a2a_overlap_chunks,
        ") needs --num-experts > 0: it pipelines the MoE layer's expert all-to-alls"));
  }
  if (!c.moe()) return absl::OkStatus();
  if (c.moe_router_topk < 1 || c.moe_router_topk > c.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("--moe-router-topk (", c.moe_router_topk,
                                                   ") must lie in [1, --num-experts (",
                                                   c.num_experts, ")]"));
  }
  if (c.moe_layer_freq < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-layer-freq (", c.moe_layer_freq, ") must be >= 1 (layer l is MoE when l % N == 0)"));
  }
  if (!(c.moe_aux_loss_coeff >= 0) || !(c.moe_z_loss_coeff >= 0) ||
      !(c.moe_expert_capacity_factor >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-aux-loss-coeff (", c.moe_aux_loss_coeff, "), --moe-z-loss-coeff (",
        c.moe_z_loss_coeff, ") and --moe-expert-capacity-factor (", c.moe_expert_capacity_factor,
        ") must be >= 0"));
  }
  if (c.moe_pad_expert_input_to_capacity && c.moe_expert_capacity_factor <= 0) {
    return absl::InvalidArgumentError(
        "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor > 0 (dropless "
        "experts have no capacity to pad to)");
  }
  if (c.add_bias_linear) {
    return absl::InvalidArgumentError(
        "--num-experts needs --disable-bias-linear (experts have no biases, as in Megatron's "
        "grouped-GEMM experts and Mixtral)");
  }
  if (!c.device.is_cpu()) {
    return absl::UnimplementedError(
        "--num-experts runs on --device=cpu only for now (the router and the token dispatch "
        "are host code)");
  }
  return absl::OkStatus();
}

absl::Status ValidateRecompute(const GptConfig& c, int64_t layers_per_chunk) {
  const absl::string_view g = core::EnumName(c.recompute_granularity);
  const absl::string_view m = core::EnumName(c.recompute_method);
  if (!c.recompute_full()) {
    if (c.recompute_method != RecomputeMethod::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--recompute-method=", m, " needs --recompute-granularity=full (got ",
          g.empty() ? "none" : g, "; selective always recomputes the attention core of every "
          "layer)"));
    }
    if (c.recompute_num_layers != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--recompute-num-layers (", c.recompute_num_layers,
          ") needs --recompute-granularity=full and --recompute-method (got ",
          g.empty() ? "no --recompute-granularity" : absl::StrCat("--recompute-granularity=", g),
          ")"));
    }
    return absl::OkStatus();
  }
  if (c.recompute_method == RecomputeMethod::kNone) {
    return absl::InvalidArgumentError(
        "--recompute-granularity=full needs --recompute-method=uniform (groups of "
        "--recompute-num-layers layers) or block (the first --recompute-num-layers layers of "
        "each chunk)");
  }
  if (c.recompute_num_layers < 1 || c.recompute_num_layers > layers_per_chunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute-num-layers (", c.recompute_num_layers, ") must lie in [1, ",
        layers_per_chunk, "], the layers of one model chunk (--num-layers / "
        "(--pipeline-model-parallel-size x virtual stages))"));
  }
  return absl::OkStatus();
}

int64_t QkvWeightRow(const GptConfig& c, QkvPart part, int64_t head, int64_t e) {
  const int64_t d = c.head_dim(), n = c.num_attention_heads / c.query_groups();
  switch (part) {
    case QkvPart::kQuery:
      return ((head / n) * (n + 2) + head % n) * d + e;
    case QkvPart::kKey:
      return (head * (n + 2) + n) * d + e;
    case QkvPart::kValue:
      return (head * (n + 2) + n + 1) * d + e;
  }
  return -1;
}

BlockParamNames::BlockParamNames(int64_t layer) : prefix_(absl::StrCat("layers.", layer, ".")) {
  auto name = [&](const char* rest) { return prefix_ + rest; };
  input_norm_weight = name("input_layernorm.weight");
  input_norm_bias = name("input_layernorm.bias");
  qkv_weight = name("attention.qkv.weight");
  qkv_bias = name("attention.qkv.bias");
  dense_weight = name("attention.dense.weight");
  dense_bias = name("attention.dense.bias");
  post_norm_weight = name("post_attention_layernorm.weight");
  post_norm_bias = name("post_attention_layernorm.bias");
  fc1_weight = name("mlp.dense_h_to_4h.weight");
  fc1_bias = name("mlp.dense_h_to_4h.bias");
  fc2_weight = name("mlp.dense_4h_to_h.weight");
  fc2_bias = name("mlp.dense_4h_to_h.bias");
  router_weight = name("mlp.router.weight");
}

std::string BlockParamNames::expert_fc1_weight(int64_t e) const {
  return absl::StrCat(prefix_, "mlp.experts.", e, ".dense_h_to_4h.weight");
}

std::string BlockParamNames::expert_fc2_weight(int64_t e) const {
  return absl::StrCat(prefix_, "mlp.experts.", e, ".dense_4h_to_h.weight");
}

std::vector<ParamSpec> BlockParamSpecs(const GptConfig& c, int64_t layer,
                                       const ExpertShard& shard) {
  const BlockParamNames n(layer);
  const int64_t h = c.hidden_size, f = c.ffn();
  const int64_t qkv_rows = (c.num_attention_heads + 2 * c.query_groups()) * c.head_dim();
  const float std = c.init_method_std;
  // Megatron scales the init of the projections that feed the residual stream.
  const float scaled = std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  const bool bias = c.add_bias_linear, ln = !c.rms_norm();
  std::vector<ParamSpec> specs;
  auto norm = [&](const std::string& weight, const std::string& beta) {
    specs.push_back(Spec(weight, {h}, TpSplit::kReplicated, Init::kOnes, 0, false, true));
    if (ln) specs.push_back(Spec(beta, {h}, TpSplit::kReplicated, Init::kZeros, 0, false, true));
  };
  norm(n.input_norm_weight, n.input_norm_bias);
  // Rows ordered [group, {q x heads/groups, k, v}, head_dim]: a TP rank's row
  // block is whole query groups (whole heads without GQA). See gpt_config.h.
  specs.push_back(Spec(n.qkv_weight, {qkv_rows, h}, TpSplit::kRows, Init::kNormal, std, true));
  if (c.qkv_bias()) {
    specs.push_back(Spec(n.qkv_bias, {qkv_rows}, TpSplit::kRows, Init::kZeros, 0, false));
  }
  specs.push_back(
      Spec(n.dense_weight, {h, h}, TpSplit::kCols, Init::kScaledNormal, scaled, true));
  if (bias) {
    specs.push_back(
        Spec(n.dense_bias, {h}, TpSplit::kReplicated, Init::kZeros, 0, false, true));
  }
  norm(n.post_norm_weight, n.post_norm_bias);
  if (c.moe_layer(layer)) {
    // The router (replicated: every TP rank routes the same tokens) and E
    // experts, each a dense MLP split over TP like the one below (no biases:
    // ValidateMoe). Globally named, so checkpoints do not depend on the layout.
    specs.push_back(Spec(n.router_weight, {c.num_experts, h}, TpSplit::kReplicated,
                         Init::kNormal, std, true));
    const int64_t first = shard.first(c.num_experts);
    for (int64_t e = first; e < first + shard.count(c.num_experts); ++e) {
      specs.push_back(c.swiglu ? Spec(n.expert_fc1_weight(e), {2, f * h}, TpSplit::kCols,
                                      Init::kNormal, std, true)
                               : Spec(n.expert_fc1_weight(e), {f, h}, TpSplit::kRows,
                                      Init::kNormal, std, true));
      specs.push_back(Spec(n.expert_fc2_weight(e), {h, f}, TpSplit::kCols, Init::kScaledNormal,
                           scaled, true));
      specs[specs.size() - 2].expert = specs.back().expert = true;
    }
    return specs;
  }
  if (c.swiglu) {
    // [gate; up], each [f, h] flattened: a column block is a rank's slice of both.
    specs.push_back(Spec(n.fc1_weight, {2, f * h}, TpSplit::kCols, Init::kNormal, std, true));
    if (bias) {
      specs.push_back(Spec(n.fc1_bias, {2, f}, TpSplit::kCols, Init::kZeros, 0, false));
    }
  } else {
    specs.push_back(Spec(n.fc1_weight, {f, h}, TpSplit::kRows, Init::kNormal, std, true));
    if (bias) specs.push_back(Spec(n.fc1_bias, {f}, TpSplit::kRows, Init::kZeros, 0, false));
  }
  specs.push_back(Spec(n.fc2_weight, {h, f}, TpSplit::kCols, Init::kScaledNormal, scaled, true));
  if (bias) {
    specs.push_back(Spec(n.fc2_bias, {h}, TpSplit::kReplicated, Init::kZeros, 0, false, true));
  }
  return specs;
}

std::vector<ParamSpec> EmbeddingParamSpecs(const GptConfig& c, int tp) {
  const int64_t vocab = PaddedVocabSize(c.vocab_size, c.make_vocab_size_divisible_by, tp);
  ParamSpec word = Spec(kWordEmbeddingName, {vocab, c.hidden_size}, TpSplit::kRows, Init::kNormal,
                        c.init_method_std, true);
  word.unpadded_rows = c.vocab_size;
  std::vector<ParamSpec> specs = {word};
  if (c.learned_positions()) {
    specs.push_back(Spec(kPositionEmbeddingName, {c.max_positions(), c.hidden_size},
                         TpSplit::kReplicated, Init::kNormal, c.init_method_std, true, true));
  }
  return specs;
}

std::vector<ParamSpec> FinalNormParamSpecs(const GptConfig& c) {
  std::vector<ParamSpec> specs = {Spec(kFinalNormWeightName, {c.hidden_size},
                                       TpSplit::kReplicated, Init::kOnes, 0, false, true)};
  if (!c.rms_norm()) {
    specs.push_back(Spec(kFinalNormBiasName, {c.hidden_size}, TpSplit::kReplicated, Init::kZeros,
                         0, false, true));
  }
  return specs;
}

std::vector<ParamSpec> OutputLayerParamSpecs(const GptConfig& c, int tp) {
  if (c.tied_output_layer()) return {};
  const int64_t vocab = PaddedVocabSize(c.vocab_size, c.make_vocab_size_divisible_by, tp);
  ParamSpec out = Spec(kOutputLayerName, {vocab, c.hidden_size}, TpSplit::kRows, Init::kNormal,
                       c.init_method_std, true);
  out.unpadded_rows = c.vocab_size;
  return {out};
}

std::vector<ParamSpec> ModelParamSpecs(const GptConfig& c) {
  std::vector<ParamSpec> specs = EmbeddingParamSpecs(c, 1);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (ParamSpec& s : BlockParamSpecs(c, i)) specs.push_back(std::move(s));
  }
  for (ParamSpec& s : FinalNormParamSpecs(c)) specs.push_back(std::move(s));
  for (ParamSpec& s : OutputLayerParamSpecs(c, 1)) specs.push_back(std::move(s));
  return specs;
}

int64_t ParameterCount(const GptConfig& c) {
  const int64_t h = c.hidden_size, f = c.ffn();
  const int64_t qkv = (c.num_attention_heads + 2 * c.query_groups()) * c.head_dim();
  const int64_t up = c.swiglu ? 2 * f : f;
  const int64_t norm = c.rms_norm() ? h : 2 * h;
  const int64_t biases = (c.qkv_bias() ? qkv : 0) + (c.add_bias_linear ? h + up + h : 0);
  const int64_t block = 2 * norm + qkv * h + h * h + up * h + h * f + biases;
  // An MoE layer (no biases: ValidateMoe): E experts and the router [E, h]
  // instead of one MLP.
  const int64_t moe_block =
      block - (up * h + h * f) + c.num_experts * (up * h + h * f) + c.num_experts * h;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.moe_layer(l) ? 1 : 0;
  const int64_t embeddings = c.vocab_size * h * (c.tied_output_layer() ? 1 : 2) +
                             (c.learned_positions() ? c.max_positions() * h : 0);
  return (c.num_layers - moe_layers) * block + moe_layers * moe_block + embeddings + norm;
}

int64_t ActiveParameterCount(const GptConfig& c) {
  if (!c.moe()) return ParameterCount(c);
  const int64_t h = c.hidden_size, f = c.ffn(), up = c.swiglu ? 2 * f : f;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.moe_layer(l) ? 1 : 0;
  return ParameterCount(c) - moe_layers * (c.num_experts - c.moe_router_topk) * (up * h + h * f);
}

}  // namespace loom::layers
