#ifndef LOOM_TRAIN_DATA_PACKING_H_
#define LOOM_TRAIN_DATA_PACKING_H_

// Documents packed into one sample, as Megatron reads them from the EOD
// tokens (megatron/core/datasets/gpt_dataset.py,
// _get_ltor_masks_and_position_ids, called on a sample's input tokens):
//   --reset-position-ids    position ids restart at 0 after each EOD (the EOD
//                           keeps its document's next position);
//   --reset-attention-mask  a token after an EOD does not attend to any token
//                           at or before it (the EOD belongs to the document
//                           it ends);
//   --eod-mask-loss         the loss mask is 0 where the INPUT token is EOD.

#include <cstdint>
#include <vector>

namespace loom::train {

struct PackingOptions {
  int32_t eod = -1;  // the tokenizer's end-of-document id
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool any() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
};

// The masks of one sample of n input tokens.
struct SampleMasks {
  // The position id of token i: i, or with reset_position_ids its offset in
  // its document.
  std::vector<int32_t> position;
  // The first position token i attends to (Megatron's mask row i is open on
  // [doc_start[i], i]): 0, or with reset_attention_mask one past the last EOD
  // before i. Megatron's attention_mask[i][j] is False (attend) iff
  // doc_start[i] <= j <= i.
  std::vector<int32_t> doc_start;
  // 1, or 0 where eod_mask_loss and tokens[i] is EOD.
  std::vector<float> loss_mask;
};

SampleMasks LtorMasksAndPositionIds(const int32_t* tokens, int64_t n, const PackingOptions& o);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_PACKING_H_
