#ifndef LOOM_CHECKPOINT_HF_HF_CONFIG_H_
#define LOOM_CHECKPOINT_HF_HF_CONFIG_H_

// A Hugging Face config.json as Megatron's model options (the names of
// //train:gpt's flags). Supported: GPT2LMHeadModel, LlamaForCausalLM,
// MistralForCausalLM where it is Llama's architecture (no sliding window
// shorter than the context), MixtralForCausalLM (Llama's attention with
// every MLP a mixture of SwiGLU experts: Loom's --num-experts with
// --moe-layer-freq=1, Mixtral's top-k routing, dropless), and
// Qwen2ForCausalLM without a sliding window (Llama's architecture with a
// bias on the q/k/v projections only: --add-qkv-bias). Both transformers 4
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
#include "models/gpt/gpt_architecture.h"

namespace loom::checkpoint::hf {

// The architecture (models/gpt/gpt_architecture.h's fields: what the model
// computes) plus what the file says about itself. seq_length and
// make_vocab_size_divisible_by are no part of a config.json: they keep
// GptArchitecture's defaults (the import chooses the sequence length).
struct HfModelConfig : layers::GptArchitecture {
  std::string path;          // the config.json as given (for messages)
  std::string architecture;  // "GPT2LMHeadModel", "LlamaForCausalLM", ... "Qwen2ForCausalLM"
  std::string model_type;    // "gpt2", "llama", "mistral", "mixtral", "qwen2"
  std::string hidden_act;    // as in the file: "gelu_new", "silu", ...
  std::string dtype;         // the saved torch dtype ("float32", "bfloat16"); "" if absent
  // Mixtral's router_aux_loss_coef. Training only: transformers adds its
  // load-balancing loss only with output_router_logits, Loom's
  // --moe-aux-loss-coeff always.
  double moe_aux_loss_coeff = 0;
};

// `text` is the content of the config.json at `path` (named in errors).
absl::StatusOr<HfModelConfig> ParseHfConfig(const std::string& text, const std::string& path);

// Reads `path`: a config.json, or a model folder holding one.
absl::StatusOr<HfModelConfig> ReadHfConfig(const std::string& path);

// The model flags of //train:gpt (Megatron's spelling): every architecture
// flag (models/gpt/gpt_architecture.h) that applies to the model, booleans only
// when on, numbers unless 0 (--num-experts=0), in the table's order; e.g. for the tiny Llama:
//   --num-layers=2 --hidden-size=32 --num-attention-heads=4 --ffn-hidden-size=64
//   --max-position-embeddings=32 --normalization=RMSNorm --norm-epsilon=1e-05
//   --position-embedding-type=rope --rotary-base=10000 --rotary-percent=1 --swiglu
//   --group-query-attention --num-query-groups=2 --untie-embeddings-and-output-weights
//   --disable-bias-linear
// Qwen2 adds --add-qkv-bias; Mixtral --num-experts=E --moe-router-topk=K
// --moe-layer-freq=1 and --moe-aux-loss-coeff=C (C only when positive).
// The vocabulary is not a flag: //train:gpt takes it from the tokenizer,
// which must have vocab_size entries.
std::vector<std::string> GptFlags(const HfModelConfig& config);
std::string GptFlagsString(const HfModelConfig& config);  // joined by spaces

}  // namespace loom::checkpoint::hf

#endif  // LOOM_CHECKPOINT_HF_HF_CONFIG_H_
