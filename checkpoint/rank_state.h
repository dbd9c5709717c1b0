#ifndef LOOM_CHECKPOINT_RANK_STATE_H_
#define LOOM_CHECKPOINT_RANK_STATE_H_

// What one rank saves and restores, and how its local shards map onto the
// layout-independent global tensors of a checkpoint:
//  - a kRows parameter on TP rank r holds global rows [split_start, +local rows),
//    a kCols one global columns [split_start, +local cols), a replicated one all;
//  - the word embedding is stored unpadded ([vocab_size, hidden]); the rows a
//    TP layout pads it with are never stored and load as zeros;
//  - Adam moments cover the flat ranges `moment_ranges` of the rank's buffer
//    (all of it, or its ZeRO-1 shard: a slice of every gradient bucket), back
//    to back: per parameter that is a row-major flat range of its rectangle.
// Who writes what (each element stored once): parameters and (without the
// distributed optimizer) moments on DP rank 0; replicated tensors on TP rank
// 0; the word embedding (tied, on the first and last stage) on PP rank 0.

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/model_config.h"  // the manifest's model, which callers use with these
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "core/tensor.h"
#include "layers/params.h"
#include "models/gpt/gpt_config.h"

namespace loom::checkpoint {

struct RankView {
  layers::GptConfig model;  // vocab_size: the tokenizer's (unpadded)
  layers::ParamBuffer* params = nullptr;
  // Adam moments over the flat ranges `moment_ranges` of the buffer, back to
  // back (null: none).
  core::Tensor* exp_avg = nullptr;     // f32[>= total length of moment_ranges]
  core::Tensor* exp_avg_sq = nullptr;
  std::vector<std::pair<int64_t, int64_t>> moment_ranges;  // sorted [begin, end)
  // ZeRO-3 (optim_grads_params): the parameters' values of `moment_ranges`,
  // back to back like the moments (params holds none): each rank saves and
  // loads its own ranges, as the moments. Null: params->flat_values().
  core::Tensor* values = nullptr;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
  // Under expert parallelism the rank among those holding the same experts
  // (ParamSpec::expert; DP / EP x CP ranks): its first rank writes them
  // (dp_rank 0 holds only some experts). dp_rank without EP.
  int expert_dp_rank = 0;
  bool distributed_optimizer = false;
};

// Where a rank's shard of a parameter sits in its global tensor.
struct Placement {
  std::vector<int64_t> global_shape;  // unpadded
  Region rect;                        // the stored part of the local shard (flat: all of it)
};
// A TP shard of a parameter in the matrix view of its (padded) global shape:
// local rows x cols, starting at global row (kRows) or column (kCols)
// `split_start`.
struct Shard {
  int64_t split_start = 0;
  int64_t rows = 0, cols = 0;
};
// The one placement rule (writer, loader and the offline converter): the
// shard's rectangle, without the vocabulary padding rows past the unpadded
// global shape (never stored).
Placement PlacementOf(const layers::ParamSpec& spec, const Shard& shard);
// Parameter `p` as its rank holds it.
Placement PlacementOf(const layers::Param& p);

// The slices this rank writes (pointing into its live buffers).
std::vector<Piece> PiecesToSave(const RankView& view, bool save_optimizer);

// Fills this rank's parameters (and moments, when `load_optimizer` and the
// checkpoint has them) from `reader`. Padding is zeroed.
absl::Status LoadRank(CheckpointReader& reader, const RankView& view, bool load_optimizer);


}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_RANK_STATE_H_
