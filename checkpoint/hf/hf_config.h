#ifndef LOOM_CHECKPOINT_HF_HF_CONFIG_H_
#define LOOM_CHECKPOINT_HF_HF_CONFIG_H_

// A Hugging Face config.json as Megatron's model options (the names of
// //train:gpt's flags). Supported: GPT2LMHeadModel, LlamaForCausalLM,
// MistralForCausalLM where it is Llama's architecture (no sliding window
// shorter than the context), and MixtralForCausalLM (Llama's attention with
// every MLP a mixture of SwiGLU experts: Loom's --num-experts with
// --moe-layer-freq=1, Mixtral's top-k routing, dropless). Both transformers 4
// (rope_theta, rope_scaling, torch_dtype) and 5 (rope_parameters, dtype)
// spellings are read.
//
// Anything that would make a different model than Loom computes (RoPE
// scaling, a sliding window, biases in Llama, another activation, a head_dim
// other than hidden/heads, router jitter, quantized weights, an unknown
// architecture, ...)
// is an InvalidArgument naming the file, the field and its value: a config is
// never silently taken for a different model. Fields that do not change the
// model's function (dropouts, token ids, use_cache, ...) are ignored.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::checkpoint::hf {

struct HfModelConfig {
  std::string path;          // the config.json as given (for messages)
  std::string architecture;  // "GPT2LMHeadModel", "LlamaForCausalLM", ... "MixtralForCausalLM"
  std::string model_type;    // "gpt2", "llama", "mistral", "mixtral"
  std::string hidden_act;    // as in the file: "gelu_new", "silu", ...
  std::string dtype;         // the saved torch dtype ("float32", "bfloat16"); "" if absent

  // Megatron's options.
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  bool group_query_attention = false;
  int64_t num_query_groups = 0;  // key/value heads (== num_attention_heads without GQA)
  int64_t ffn_hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  std::string normalization;  // "LayerNorm" | "RMSNorm"
  double norm_epsilon = 0;
  std::string position_embedding_type;  // "learned_absolute" | "rope"
  double rotary_base = 10000;           // rope only
  double rotary_percent = 1.0;          // rope only
  bool swiglu = false;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;
  // Mixtral (0 experts: dense). Every layer is an MoE layer (--moe-layer-freq=1).
  int64_t num_experts = 0;      // num_local_experts
  int64_t moe_router_topk = 0;  // num_experts_per_tok
  // router_aux_loss_coef. Training only: transformers adds its load-balancing
  // loss only with output_router_logits, Loom's --moe-aux-loss-coeff always.
  double moe_aux_loss_coeff = 0;

  int64_t head_dim() const { return num_attention_heads ? hidden_size / num_attention_heads : 0; }
};

// `text` is the content of the config.json at `path` (named in errors).
absl::StatusOr<HfModelConfig> ParseHfConfig(const std::string& text, const std::string& path);

// Reads `path`: a config.json, or a model folder holding one.
absl::StatusOr<HfModelConfig> ReadHfConfig(const std::string& path);

// The model flags of //train:gpt (Megatron's spelling), e.g. for the tiny Llama:
//   --num-layers=2 --hidden-size=32 --num-attention-heads=4 --ffn-hidden-size=64
//   --max-position-embeddings=32 --normalization=RMSNorm --norm-epsilon=1e-05
//   --position-embedding-type=rope --rotary-base=10000 --swiglu --group-query-attention
//   --num-query-groups=2 --untie-embeddings-and-output-weights --disable-bias-linear
// and for Mixtral also --num-experts=E --moe-router-topk=K --moe-aux-loss-coeff=C
// (C only when positive).
// Flags at their Megatron default are still written where they define the
// architecture (normalization, position embedding type); boolean flags appear
// only when on. The vocabulary is not a flag: //train:gpt takes it from the
// tokenizer, which must have vocab_size entries.
std::vector<std::string> GptFlags(const HfModelConfig& config);
std::string GptFlagsString(const HfModelConfig& config);  // joined by spaces

}  // namespace loom::checkpoint::hf

#endif  // LOOM_CHECKPOINT_HF_HF_CONFIG_H_
