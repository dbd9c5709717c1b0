#ifndef LOOM_CHECKPOINT_EXPORT_H_
#define LOOM_CHECKPOINT_EXPORT_H_

// Export to Hugging Face safetensors + config.json, so transformers'
// from_pretrained(out) loads the model, through the one tensor map that
// import also uses (models/gpt/hf_tensor_map.h: names, shapes, layouts):
//
// GPT-2 checkpoints (LayerNorm, learned_absolute, GELU, biases, tied) export
// as GPT2LMHeadModel ("transformer." prefix; lm_head is tied to wte).
//
// Llama-family checkpoints (--normalization RMSNorm, --position-embedding-type
// rope, --swiglu, --disable-bias-linear) export as LlamaForCausalLM ("model."
// prefix; lm_head from output_layer.weight when untied).
//
// Mixture-of-experts checkpoints of that architecture with every layer MoE
// (--moe-layer-freq=1) export as MixtralForCausalLM (block_sparse_moe.gate
// from mlp.router, experts.e.w1/w3/w2 from mlp.experts.e.*). Other MoE
// checkpoints are refused.

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
