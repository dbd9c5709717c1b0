#ifndef LOOM_CHECKPOINT_MODEL_CONFIG_H_
#define LOOM_CHECKPOINT_MODEL_CONFIG_H_

// The model a checkpoint describes: its manifest's ModelConfig. The
// architecture fields are those of models/gpt/gpt_architecture.h, stored under
// their flag's name (ModelConfig's field of the same name, found through
// protobuf reflection), so a new field is one line there and one field here
// in checkpoint.proto. A field that does not apply to the model (RoPE's base
// without rope, MoE routing without experts) is not stored; an absent field
// reads back as GptConfig's default, which is how a checkpoint written
// before a field existed keeps meaning what it meant.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "models/gpt/gpt_config.h"

namespace loom::checkpoint {

ModelConfig ModelConfigProto(const layers::GptConfig& c);
// The GptConfig a checkpoint describes (for offline tools and resuming).
// Fails when an enum field holds a spelling Loom does not know, naming the
// field and `manifest` (the file it came from).
absl::StatusOr<layers::GptConfig> GptConfigFromProto(const ModelConfig& m,
                                                     const std::string& manifest);
// Compares the architecture a checkpoint was saved with against the flags,
// field by field in the table's order (defining values: ffn() for a 0
// --ffn-hidden-size, ...): the error names the flag and both values.
absl::Status CheckModelConfig(const ModelConfig& saved, const layers::GptConfig& flags,
                              const std::string& checkpoint_path);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_MODEL_CONFIG_H_
