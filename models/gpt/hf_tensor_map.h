#ifndef LOOM_MODELS_GPT_HF_TENSOR_MAP_H_
#define LOOM_MODELS_GPT_HF_TENSOR_MAP_H_

// The one map between Loom's parameters and a Hugging Face model's tensors:
// a table of {Loom name, HF tensor(s) with their HF shapes, transform} that
// import (checkpoint/hf/import.cc, HF -> Loom) and export
// (checkpoint/export.cc, Loom -> HF) both walk, so the two directions cannot
// drift apart. Names and layouts (h hidden, H heads, G query groups, n = H/G,
// d = h/H, F = ffn(), V vocabulary, P max positions; Loom's side is
// models/gpt/gpt_config.h's list):
//
//   GPT-2 (prefix "transformer." or ""; Conv1D weights are stored [in, out]):
//     wte.weight [V, h]               -> embedding.word_embeddings.weight
//     wpe.weight [P, h]               -> embedding.position_embeddings.weight
//     h.i.ln_1.{weight,bias} [h]      -> layers.i.input_layernorm.*
//     h.i.attn.c_attn.weight [h, 3h]  -> layers.i.attention.qkv.weight [3h, h]:
//         transposed; HF column j = part·h + head·d + e is Loom row
//         QkvWeightRow(part, head, e) = (head·3 + part)·d + e
//     h.i.attn.c_attn.bias [3h]       -> layers.i.attention.qkv.bias (same rows)
//     h.i.attn.c_proj.weight [h, h]   -> layers.i.attention.dense.weight (transposed)
//     h.i.attn.c_proj.bias            -> layers.i.attention.dense.bias
//     h.i.ln_2.*                      -> layers.i.post_attention_layernorm.*
//     h.i.mlp.c_fc.weight [h, F]      -> layers.i.mlp.dense_h_to_4h.weight [F, h] (transposed)
//     h.i.mlp.c_fc.bias [F]           -> layers.i.mlp.dense_h_to_4h.bias
//     h.i.mlp.c_proj.weight [F, h]    -> layers.i.mlp.dense_4h_to_h.weight [h, F] (transposed)
//     h.i.mlp.c_proj.bias [h]         -> layers.i.mlp.dense_4h_to_h.bias
//     ln_f.{weight,bias}              -> final_layernorm.*
//   Llama / Mistral ("model." prefix, no biases):
//     lm_head.weight [V, h]           -> output_layer.weight (untied only)
//     embed_tokens.weight [V, h]      -> embedding.word_embeddings.weight
//     layers.i.input_layernorm.weight -> layers.i.input_layernorm.weight
//     layers.i.self_attn.{q,k,v}_proj.weight [H·d | G·d | G·d, h]
//                                     -> layers.i.attention.qkv.weight [(H+2G)·d, h]:
//         q_proj row j·d + e is Loom row QkvWeightRow(kQuery, j, e), k/v_proj
//         row g·d + e is QkvWeightRow(kKey / kValue, g, e)
//     layers.i.self_attn.o_proj.weight [h, H·d] -> layers.i.attention.dense.weight
//     layers.i.post_attention_layernorm.weight  -> the same
//     layers.i.mlp.{gate_proj, up_proj}.weight [F, h] (each)
//                                     -> layers.i.mlp.dense_h_to_4h.weight [2, F·h]
//     layers.i.mlp.down_proj.weight [h, F]      -> layers.i.mlp.dense_4h_to_h.weight
//     norm.weight                     -> final_layernorm.weight
//   Mixtral: as Llama, but each layer's "mlp." is "block_sparse_moe.":
//     gate.weight [E, h]              -> layers.i.mlp.router.weight
//     experts.e.{w1 (gate), w3 (up)}.weight [F, h]
//                                     -> layers.i.mlp.experts.e.dense_h_to_4h.weight [2, F·h]
//     experts.e.w2.weight [h, F]      -> layers.i.mlp.experts.e.dense_4h_to_h.weight
//
// A q/k/v_proj *bias* triple (Qwen2) is the weight's transform with width 1:
// Transform::QkvProj(config, 1).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "layers/params.h"
#include "models/gpt/gpt_config.h"

namespace loom::checkpoint::hf {

// How the Hugging Face tensors of one entry hold its one Loom tensor, as data
// that both directions read, so each is the other's inverse by construction.
// The Loom tensor is a matrix of rows of width() values (row-major, whatever
// its shape); so is each HF tensor ("part"), after a transpose where
// transposed() (GPT-2's Conv1D stores it [width, rows]); HF part p's row i is
// Loom row LoomRow(p, i). Every Loom row is exactly one HF row.
class Transform {
 public:
  // One HF tensor holding the Loom tensor as it is (`numel` values).
  static Transform Copy(int64_t numel);
  // GPT-2's Conv1D: HF [in, out] is Loom's [out, in] transposed.
  static Transform Conv1D(int64_t in, int64_t out);
  // GPT-2's c_attn (no GQA): HF column (weight [h, 3h], transposed) or element
  // (bias [3h], `weight` false) j = part·h + head·d + e is Loom row
  // QkvWeightRow(config, part, head, e).
  static Transform FusedQkv(const layers::GptConfig& config, bool weight);
  // Llama's q_proj [H·d, width], k_proj and v_proj [G·d, width] (weights:
  // width h; biases: width 1): q row j·d + e is Loom row
  // QkvWeightRow(config, kQuery, j, e), k/v row g·d + e is
  // QkvWeightRow(config, kKey / kValue, g, e).
  static Transform QkvProj(const layers::GptConfig& config, int64_t width);
  // HF tensors of rows[p] rows of `width` values, stacked in order: SwiGLU's
  // gate_proj and up_proj [F, h] (rows {F, F}, width h) -> dense_h_to_4h [2, F·h].
  static Transform Stacked(std::vector<int64_t> rows, int64_t width);

  // The HF tensors (parts() of them, in the entry's order, row-major) -> the
  // Loom tensor. InvalidArgument if a part has the wrong number of values.
  absl::StatusOr<std::vector<float>> ToLoom(std::vector<std::vector<float>> hf) const;
  // The Loom tensor -> the HF tensors. InvalidArgument if it has the wrong
  // number of values.
  absl::StatusOr<std::vector<std::vector<float>>> ToHf(std::vector<float> loom) const;

  int parts() const { return static_cast<int>(rows_.size()); }
  int64_t rows(int part) const { return rows_[part]; }
  int64_t width() const { return width_; }
  bool transposed() const { return transposed_; }
  int64_t LoomRow(int part, int64_t row) const;
  int64_t loom_numel() const;

 private:
  Transform(std::vector<int64_t> rows, int64_t width, bool transposed,
            std::vector<int64_t> loom_row);
  bool identity() const { return parts() == 1 && !transposed_ && loom_row_.empty(); }

  std::vector<int64_t> rows_;      // each HF part's rows
  int64_t width_ = 1;              // values per row
  bool transposed_ = false;        // HF parts stored [width, rows]
  std::vector<int64_t> loom_row_;  // HF row (parts concatenated) -> Loom row; empty: the same
};

// One named tensor of the Hugging Face model.
struct HfTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// One Loom parameter and the HF tensors that hold it.
struct HfMapEntry {
  std::string loom_name;            // models/gpt/gpt_config.h's global name
  std::vector<int64_t> loom_shape;  // its global shape, vocabulary unpadded
  std::vector<HfTensorSpec> hf;     // the transform's parts, in order
  Transform transform;
};

// The Hugging Face architectures whose tensors Loom maps.
enum class HfFamily {
  kGpt2,     // GPT2LMHeadModel
  kLlama,    // LlamaForCausalLM, MistralForCausalLM
  kMixtral,  // MixtralForCausalLM (every layer MoE)
};
// The family of config.json's model_type ("gpt2", "llama", "mistral",
// "mixtral"); InvalidArgument for others.
absl::StatusOr<HfFamily> HfFamilyOf(const std::string& model_type);

// The table of `family` for the model `config` (as GptConfigFromHf makes it),
// in the order transformers' save_pretrained writes the tensors. GPT-2's HF
// names start with `gpt2_prefix` ("transformer." as GPT2LMHeadModel saves
// them, "" as GPT2Model does); the others' are fixed. Built from the config
// alone: CheckCoversModel says whether it fits the config's parameters.
std::vector<HfMapEntry> HfTensorMap(HfFamily family, const layers::GptConfig& config,
                                    const std::string& gpt2_prefix = "transformer.");

// Its global shape as stored: the vocabulary rows unpadded.
std::vector<int64_t> StoredShape(const layers::ParamSpec& spec);

// Checks that `table` names every parameter of `config` exactly once with its
// stored shape, and nothing else (InvalidArgument naming the first that is
// not, for the Hugging Face architecture `what`).
absl::Status CheckCoversModel(const std::vector<HfMapEntry>& table,
                              const layers::GptConfig& config, const std::string& what);

}  // namespace loom::checkpoint::hf

#endif  // LOOM_MODELS_GPT_HF_TENSOR_MAP_H_
