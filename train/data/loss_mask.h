#ifndef LOOM_TRAIN_DATA_LOSS_MASK_H_
#define LOOM_TRAIN_DATA_LOSS_MASK_H_

// Supervised fine-tuning data is two indexed datasets with the same sequence
// lengths and documents: <prefix>.bin/.idx, the token ids (any --data-path
// reader can train on them), and <prefix>_loss_mask.bin/.idx, one u8 per
// token, 1 where the loss counts (the assistant's tokens of a conversation).
// //train:preprocess_data --sft writes both.

#include <string>

namespace loom::train {

inline std::string LossMaskPrefix(const std::string& prefix) { return prefix + "_loss_mask"; }

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_LOSS_MASK_H_
