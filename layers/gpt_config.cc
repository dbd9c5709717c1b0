#include "layers/gpt_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
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

absl::Status ValidateLayout(const GptConfig& c, int tp, bool sp, int pp, int vp) {
  if (tp < 1 || pp < 1 || vp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-model-parallel-size (", tp, "), --pipeline-model-parallel-size (", pp,
        ") and the virtual pipeline size (", vp, ") must be >= 1"));
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
  if (sp && c.seq_length % tp != 0) {
    return NotDivisible("--seq-length", c.seq_length,
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
  return absl::OkStatus();
}

std::vector<ParamSpec> BlockParamSpecs(const GptConfig& c, int64_t layer) {
  const std::string p = absl::StrCat("layers.", layer, ".");
  const int64_t h = c.hidden_size, f = c.ffn();
  const float std = c.init_method_std;
  // Megatron scales the init of the projections that feed the residual stream.
  const float scaled = std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  return {
      Spec(p + "input_layernorm.weight", {h}, TpSplit::kReplicated, Init::kOnes, 0, false, true),
      Spec(p + "input_layernorm.bias", {h}, TpSplit::kReplicated, Init::kZeros, 0, false, true),
      // Rows ordered [head, {q, k, v}, head_dim]: a TP rank's row block is whole heads.
      Spec(p + "attention.qkv.weight", {3 * h, h}, TpSplit::kRows, Init::kNormal, std, true),
      Spec(p + "attention.qkv.bias", {3 * h}, TpSplit::kRows, Init::kZeros, 0, false),
      Spec(p + "attention.dense.weight", {h, h}, TpSplit::kCols, Init::kScaledNormal, scaled, true),
      Spec(p + "attention.dense.bias", {h}, TpSplit::kReplicated, Init::kZeros, 0, false, true),
      Spec(p + "post_attention_layernorm.weight", {h}, TpSplit::kReplicated, Init::kOnes, 0, false,
           true),
      Spec(p + "post_attention_layernorm.bias", {h}, TpSplit::kReplicated, Init::kZeros, 0, false,
           true),
      Spec(p + "mlp.dense_h_to_4h.weight", {f, h}, TpSplit::kRows, Init::kNormal, std, true),
      Spec(p + "mlp.dense_h_to_4h.bias", {f}, TpSplit::kRows, Init::kZeros, 0, false),
      Spec(p + "mlp.dense_4h_to_h.weight", {h, f}, TpSplit::kCols, Init::kScaledNormal, scaled, true),
      Spec(p + "mlp.dense_4h_to_h.bias", {h}, TpSplit::kReplicated, Init::kZeros, 0, false, true),
  };
}

std::vector<ParamSpec> EmbeddingParamSpecs(const GptConfig& c, int tp) {
  const int64_t vocab = PaddedVocabSize(c.vocab_size, c.make_vocab_size_divisible_by, tp);
  ParamSpec word = Spec(kWordEmbeddingName, {vocab, c.hidden_size}, TpSplit::kRows, Init::kNormal,
                        c.init_method_std, true);
  word.unpadded_rows = c.vocab_size;
  return {
      word,
      Spec(kPositionEmbeddingName, {c.max_positions(), c.hidden_size}, TpSplit::kReplicated,
           Init::kNormal, c.init_method_std, true, true),
  };
}

std::vector<ParamSpec> FinalNormParamSpecs(const GptConfig& c) {
  return {
      Spec(kFinalNormWeightName, {c.hidden_size}, TpSplit::kReplicated, Init::kOnes, 0, false,
           true),
      Spec(kFinalNormBiasName, {c.hidden_size}, TpSplit::kReplicated, Init::kZeros, 0, false,
           true),
  };
}

int64_t ParameterCount(const GptConfig& c) {
  const int64_t h = c.hidden_size, f = c.ffn();
  const int64_t block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (f * h + f) + (h * f + h);
  return c.num_layers * block + c.vocab_size * h + c.max_positions() * h + 2 * h;
}

}  // namespace loom::layers
