#ifndef LOOM_CHECKPOINT_EXPORT_H_
#define LOOM_CHECKPOINT_EXPORT_H_

// Export to the Hugging Face GPT-2 layout (safetensors + config.json), so
// transformers.GPT2LMHeadModel.from_pretrained(out) loads the model.
// Mapping (ours -> HF, "transformer." prefix; lm_head is tied to wte):
//   embedding.word_embeddings.weight [V, h]      -> wte.weight [V, h]
//   embedding.position_embeddings.weight [P, h]  -> wpe.weight [P, h]
//   layers.i.input_layernorm.*                   -> h.i.ln_1.*
//   layers.i.attention.qkv.weight [3h, h], rows [head, {q,k,v}, d]
//                                                -> h.i.attn.c_attn.weight [h, 3h], Conv1D
//                                                   [in, out], columns [q | k | v], each
//                                                   [head, d]
//   layers.i.attention.qkv.bias [3h]             -> h.i.attn.c_attn.bias (same reorder)
//   layers.i.attention.dense.weight [h, h]       -> h.i.attn.c_proj.weight (transposed)
//   layers.i.post_attention_layernorm.*          -> h.i.ln_2.*
//   layers.i.mlp.dense_h_to_4h.weight [f, h]     -> h.i.mlp.c_fc.weight [h, f] (transposed)
//   layers.i.mlp.dense_4h_to_h.weight [h, f]     -> h.i.mlp.c_proj.weight [f, h] (transposed)
//   final_layernorm.*                            -> ln_f.*

//
// Llama-family checkpoints (--normalization RMSNorm, --position-embedding-type
// rope, --swiglu, --disable-bias-linear) export as LlamaForCausalLM ("model."
// prefix): the inverse of checkpoint/hf/import.h's mapping (q/k/v_proj from
// the grouped qkv rows, gate_proj/up_proj from dense_h_to_4h's two rows,
// lm_head from output_layer.weight when untied).
//
// Mixture-of-experts checkpoints of that architecture with every layer MoE
// (--moe-layer-freq=1) export as MixtralForCausalLM: the same, with
// block_sparse_moe.gate from mlp.router and experts.e.w1/w3/w2 from
// mlp.experts.e.* as import.h maps them. Other MoE checkpoints are refused.

#include <string>

#include "absl/status/status.h"
#include "checkpoint/hf/safetensors.h"

namespace loom::checkpoint {

// Writes `out_dir`/model.safetensors and `out_dir`/config.json from the
// checkpoint folder `iter_dir` (DIR/iter_N).
// `dtype`: hf::Dtype::kF32 or kBF16 (rounded to nearest even).
absl::Status ExportSafetensors(const std::string& iter_dir, const std::string& out_dir,
                               hf::Dtype dtype = hf::Dtype::kF32);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_EXPORT_H_
