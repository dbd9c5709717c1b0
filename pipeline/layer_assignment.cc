#include "pipeline/layer_assignment.h"

#include "absl/strings/str_format.h"

namespace loom::pipeline {

absl::Status ValidateLayerSplit(int num_layers, int pp, int vp) {
  if (num_layers < 1 || pp < 1 || vp < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--num-layers=%d, --pipeline-model-parallel-size=%d and "
        "--virtual-pipeline-model-parallel-size=%d must all be at least 1",
        num_layers, pp, vp));
  }
  if (num_layers % (pp * vp) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--num-layers=%d is not divisible by --pipeline-model-parallel-size=%d x "
        "virtual chunks per stage %d = %d, so "
        "--num-layers-per-virtual-pipeline-stage would be %d/%d, not a whole number "
        "(hint: pick --num-layers as a multiple of %d)",
        num_layers, pp, vp, pp * vp, num_layers, pp * vp, pp * vp));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerRange> LayersOf(int num_layers, int pp, int vp, int pp_rank, int chunk) {
  if (absl::Status s = ValidateLayerSplit(num_layers, pp, vp); !s.ok()) return s;
  if (pp_rank < 0 || pp_rank >= pp || chunk < 0 || chunk >= vp) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "(pp_rank %d, chunk %d) is outside P=%d stages x v=%d chunks", pp_rank, chunk, pp, vp));
  }
  const int per_chunk = num_layers / (pp * vp);
  return LayerRange{VirtualStage(pp, pp_rank, chunk) * per_chunk, per_chunk};
}

absl::StatusOr<LayerRange> ChunkLayers(const ScheduleOptions& o, int num_layers, int pp_rank,
                                       int chunk) {
  const int vs = VirtualStageOf(o, pp_rank, chunk);
  return LayersOf(num_layers, o.pp, o.vp, vs % o.pp, vs / o.pp);
}

}  // namespace loom::pipeline
