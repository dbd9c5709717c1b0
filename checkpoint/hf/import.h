#ifndef LOOM_CHECKPOINT_HF_IMPORT_H_
#define LOOM_CHECKPOINT_HF_IMPORT_H_

// Import of a Hugging Face model folder (config.json + model.safetensors or a
// sharded model.safetensors.index.json) into a Loom checkpoint at iteration 0
// with no optimizer state, laid out for TP target_tp x PP target_pp.
//
// Supported: GPT2LMHeadModel, LlamaForCausalLM / MistralForCausalLM and
// MixtralForCausalLM (as hf_config.h reads them). Name mapping (HF -> Loom, see layers/gpt_config.h):
//   GPT-2 ("transformer." prefix optional; Conv1D weights are [in, out], so
//   transposed into Loom's [out, in]):
//     wte.weight -> embedding.word_embeddings.weight, wpe.weight ->
//     embedding.position_embeddings.weight, h.i.ln_1 / ln_2 -> input_ /
//     post_attention_layernorm, h.i.attn.c_attn [h, 3h] (columns [q | k | v],
//     each [head, d]) -> attention.qkv [3h, h] (rows [head, {q,k,v}, d]),
//     attn.c_proj -> attention.dense, mlp.c_fc -> mlp.dense_h_to_4h,
//     mlp.c_proj -> mlp.dense_4h_to_h, ln_f -> final_layernorm.
//   Llama ("model." prefix): embed_tokens -> word embeddings, layers.i.
//     input_layernorm / post_attention_layernorm -> the same, q/k/v_proj ->
//     attention.qkv (rows [group, {q of its heads, k, v}, d]), o_proj ->
//     attention.dense, [gate_proj; up_proj] -> mlp.dense_h_to_4h [2, F·h],
//     down_proj -> mlp.dense_4h_to_h, norm -> final_layernorm, lm_head ->
//     output_layer.weight (untied only).
//   Mixtral: as Llama, but each layer's block_sparse_moe replaces mlp:
//     gate.weight [E, h] -> mlp.router.weight, experts.e.[w1 (gate); w3 (up)]
//     -> mlp.experts.e.dense_h_to_4h.weight [2, F·h], experts.e.w2 (down) ->
//     mlp.experts.e.dense_4h_to_h.weight [h, F].
//   A tied model's lm_head.weight, when stored, must equal the word embedding.
// Anything else in the safetensors (apart from GPT-2's attention-mask
// buffers and rotary inv_freq) is an error, as is a missing or misshapen
// tensor; nothing is written unless every check passes, and the checkpoint
// itself is written atomically (iter_0000000.tmp, then rename).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/safetensors.h"
#include "layers/gpt_config.h"

namespace loom::checkpoint::hf {

struct ImportOptions {
  std::string hf_dir, save_dir;
  int target_tp = 1, target_pp = 1;
  int64_t seq_length = 0;  // 0: min(max_position_embeddings, 1024)
};

// Writes save_dir/iter_0000000 and save_dir/latest.
absl::Status ImportHuggingFace(const ImportOptions& o);

// The Loom model a Hugging Face config describes (vocab_size from the config,
// make_vocab_size_divisible_by at the trainer default, seq_length as above).
layers::GptConfig GptConfigFromHf(const HfModelConfig& hf, int64_t seq_length = 0);

// The unpadded global Loom tensors (by Loom name) of a Hugging Face model's
// f32 tensors `tensors`, for `config` = GptConfigFromHf(hf).
struct LoomTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
absl::StatusOr<std::vector<LoomTensor>> LoomTensorsFromHf(const HfModelConfig& hf,
                                                          const layers::GptConfig& config,
                                                          const TensorSet& tensors);

}  // namespace loom::checkpoint::hf

#endif  // LOOM_CHECKPOINT_HF_IMPORT_H_
