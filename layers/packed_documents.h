#ifndef LOOM_LAYERS_PACKED_DOCUMENTS_H_
#define LOOM_LAYERS_PACKED_DOCUMENTS_H_

// The documents packed into one micro-batch's sequences (Megatron's
// --reset-position-ids and --reset-attention-mask; train/data/packing.h
// derives them from the EOD tokens). The tables cover the GLOBAL sequence of
// every batch row, [b, seq_len] row-major, so a context-parallel rank looks
// its rows up at their global positions, and a ring block compares its
// queries' document starts with the global positions of the keys it meets.

#include <cstdint>
#include <vector>

namespace loom::layers {

struct PackedDocuments {
  int64_t seq_len = 0;  // global s
  int64_t batch = 0;    // b
  // position[bi * seq_len + i]: the position id of token i of row bi (the
  // learned position table's row, RoPE's angle). Empty: i.
  std::vector<int32_t> position;
  // doc_start[bi * seq_len + i]: the first position of token i's document;
  // query i attends to keys doc_start..i only. Empty: causal over the row.
  std::vector<int32_t> doc_start;
  // loss_weight[bi * seq_len + i]: the weight of token i's loss in the mean
  // over the s·b tokens (--eod-mask-loss: mask · s·b / sum of the mask, so
  // that mean, and under CP the ranks' mean of their means, is Megatron's
  // masked mean). Empty: 1. CPU only.
  std::vector<float> loss_weight;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_PACKED_DOCUMENTS_H_
