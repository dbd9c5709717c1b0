#ifndef LOOM_PIPELINE_LAYER_ASSIGNMENT_H_
#define LOOM_PIPELINE_LAYER_ASSIGNMENT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/schedule.h"

namespace loom::pipeline {

// Which global transformer layers a (pp_rank, chunk) owns, Megatron's interleaved layout:
// with L layers, P stages and v chunks per stage, each chunk holds L/(P·v) consecutive layers
// and chunk c of stage r is virtual stage c·P + r, holding
//   [(c·P + r)·L/(P·v), (c·P + r + 1)·L/(P·v)).
// With v = 1 this is the plain split: stage r holds [r·L/P, (r+1)·L/P).
struct LayerRange {
  int first = 0;  // first global layer index
  int count = 0;  // number of layers; the range is [first, first + count)
  int end() const { return first + count; }
};

// OK iff L is divisible by P·v; the error names --num-layers,
// --pipeline-model-parallel-size and --num-layers-per-virtual-pipeline-stage.
absl::Status ValidateLayerSplit(int num_layers, int pp, int vp);

absl::StatusOr<LayerRange> LayersOf(int num_layers, int pp, int vp, int pp_rank, int chunk);

// The layers of (pp_rank, chunk) under the schedule's placement: its virtual stage
// vs = VirtualStageOf(options, pp_rank, chunk) holds [vs·L/(P·v), (vs + 1)·L/(P·v)), Megatron's
// interleaving or the V of zbv and dualpipev (stage r: virtual stages r and 2P − 1 − r).
absl::StatusOr<LayerRange> ChunkLayers(const ScheduleOptions& options, int num_layers,
                                       int pp_rank, int chunk);

// Virtual stage of (pp_rank, chunk) in Megatron's interleaving: chunk·P + pp_rank.
inline int VirtualStage(int pp, int pp_rank, int chunk) { return chunk * pp + pp_rank; }

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_LAYER_ASSIGNMENT_H_
