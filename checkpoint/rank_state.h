#ifndef LOOM_CHECKPOINT_RANK_STATE_H_
#define LOOM_CHECKPOINT_RANK_STATE_H_

// What one rank saves and restores, and how its local shards map onto the
// layout-independent global tensors of a checkpoint:
//  - a kRows parameter on TP rank r holds global rows [split_start, +local rows),
//    a kCols one global columns [split_start, +local cols), a replicated one all;
//  - the word embedding is stored unpadded ([vocab_size, hidden]); the rows a
//    TP layout pads it with are never stored and load as zeros;
//  - Adam moments cover the flat range [shard_begin, shard_end) of the rank's
//    buffer (its DP shard under the distributed optimizer): per parameter
//    that is a row-major flat range of its rectangle.
// Who writes what (each element stored once): parameters and (without the
// distributed optimizer) moments on DP rank 0; replicated tensors on TP rank
// 0; the word embedding (tied, on the first and last stage) on PP rank 0.

#include <vector>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "core/tensor.h"
#include "layers/gpt_config.h"
#include "layers/params.h"

namespace loom::checkpoint {

struct RankView {
  layers::GptConfig model;  // vocab_size: the tokenizer's (unpadded)
  layers::ParamBuffer* params = nullptr;
  // Adam moments over [shard_begin, shard_end) of the flat buffer (null: none).
  core::Tensor* exp_avg = nullptr;     // f32[>= shard_end - shard_begin]
  core::Tensor* exp_avg_sq = nullptr;
  int64_t shard_begin = 0, shard_end = 0;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
  bool distributed_optimizer = false;
};

// Where parameter `p` (as held by its rank) sits in its global tensor.
struct Placement {
  std::vector<int64_t> global_shape;  // unpadded
  Region rect;                        // the stored part of the local shard (flat: all of it)
};
Placement PlacementOf(const layers::Param& p, const layers::GptConfig& model);

// The slices this rank writes (pointing into its live buffers).
std::vector<Piece> PiecesToSave(const RankView& view, bool save_optimizer);

// Fills this rank's parameters (and moments, when `load_optimizer` and the
// checkpoint has them) from `reader`. Padding is zeroed.
absl::Status LoadRank(CheckpointReader& reader, const RankView& view, bool load_optimizer);

ModelConfig ModelConfigProto(const layers::GptConfig& c);
// Compares the architecture a checkpoint was saved with against the flags:
// the error names the flag and both values.
absl::Status CheckModelConfig(const ModelConfig& saved, const layers::GptConfig& flags,
                              const std::string& checkpoint_path);
// The GptConfig a checkpoint describes (for offline tools).
layers::GptConfig GptConfigFromProto(const ModelConfig& m);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_RANK_STATE_H_
