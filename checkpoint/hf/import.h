#ifndef LOOM_CHECKPOINT_HF_IMPORT_H_
#define LOOM_CHECKPOINT_HF_IMPORT_H_

// Import of a Hugging Face model folder (config.json + model.safetensors or a
// sharded model.safetensors.index.json) into a Loom checkpoint at iteration 0
// with no optimizer state, laid out for TP target_tp x PP target_pp.
//
// Supported: GPT2LMHeadModel, LlamaForCausalLM / MistralForCausalLM and
// MixtralForCausalLM (as hf_config.h reads them), through the one Hugging
// Face tensor map that export also uses (models/gpt/hf_tensor_map.h: names,
// shapes and layouts). A tied model's lm_head.weight, when stored, must
// equal the word embedding.
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
#include "models/gpt/gpt_config.h"

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
