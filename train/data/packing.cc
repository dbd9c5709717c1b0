#include "train/data/packing.h"

namespace loom::train {

SampleMasks LtorMasksAndPositionIds(const int32_t* tokens, int64_t n, const PackingOptions& o) {
  SampleMasks m;
  m.position.resize(n);
  m.doc_start.resize(n);
  m.loss_mask.resize(n);
  int32_t start = 0;  // the current document's first position
  for (int64_t i = 0; i < n; ++i) {
    const bool eod = tokens[i] == o.eod;
    m.position[i] = static_cast<int32_t>(o.reset_position_ids ? i - start : i);
    m.doc_start[i] = o.reset_attention_mask ? start : 0;
    m.loss_mask[i] = o.eod_mask_loss && eod ? 0.0f : 1.0f;
    if (eod) start = static_cast<int32_t>(i + 1);  // the next token opens a document
  }
  return m;
}

}  // namespace loom::train
