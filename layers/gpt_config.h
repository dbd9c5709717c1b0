#ifndef LOOM_LAYERS_GPT_CONFIG_H_
#define LOOM_LAYERS_GPT_CONFIG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "layers/params.h"

namespace loom::layers {

// The model's shape and initialisation, named after Megatron's flags.
struct GptConfig {
  int64_t num_layers = 2;                  // --num-layers
  int64_t hidden_size = 64;                // --hidden-size
  int64_t num_attention_heads = 4;         // --num-attention-heads
  int64_t ffn_hidden_size = 0;             // --ffn-hidden-size (0: 4 x hidden)
  int64_t seq_length = 32;                 // --seq-length
  int64_t max_position_embeddings = 0;     // --max-position-embeddings (0: seq_length)
  int64_t vocab_size = 256;                // from the tokenizer
  int64_t make_vocab_size_divisible_by = 128;  // --make-vocab-size-divisible-by
  float init_method_std = 0.02f;           // --init-method-std
  float layernorm_epsilon = 1e-5f;
  uint64_t seed = 1234;                    // --seed
  // Where the parameters and activations live (--device) and the dtype the
  // layers compute in (--bf16: bf16 weights and activations; the optimizer
  // keeps f32 master weights and f32 gradients either way).
  core::Device device = core::Device::CPU();
  core::DType compute_dtype = core::DType::kF32;

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t max_positions() const {
    return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
  }
};

// Checks that the model can be laid out over tp x pp (x vp chunks per stage),
// with or without sequence parallelism, before any work starts. Errors name
// the flags and the two numbers that do not divide.
absl::Status ValidateLayout(const GptConfig& config, int tp, bool sequence_parallel, int pp = 1,
                            int vp = 1);

// The global, layout-independent names of the parameters outside the blocks:
// spelled here only (checkpoints store tensors by these names). Code that
// needs one of them at run time holds a ParamHandle (see GptModel).
inline constexpr char kWordEmbeddingName[] = "embedding.word_embeddings.weight";
inline constexpr char kPositionEmbeddingName[] = "embedding.position_embeddings.weight";
inline constexpr char kFinalNormWeightName[] = "final_layernorm.weight";
inline constexpr char kFinalNormBiasName[] = "final_layernorm.bias";

// Global parameter specs of layer `layer` (pre-LN transformer block).
std::vector<ParamSpec> BlockParamSpecs(const GptConfig& config, int64_t layer);
// Token + position embedding (the token table is also the tied output layer).
std::vector<ParamSpec> EmbeddingParamSpecs(const GptConfig& config, int tp);
std::vector<ParamSpec> FinalNormParamSpecs(const GptConfig& config);

// Global parameter count of the model (unpadded vocabulary), for MFU.
int64_t ParameterCount(const GptConfig& config);

}  // namespace loom::layers

#endif  // LOOM_LAYERS_GPT_CONFIG_H_
