#include "checkpoint/convert.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "core/status_macros.h"
#include "models/gpt/gpt_config.h"
#include "pipeline/layer_assignment.h"

namespace loom::checkpoint {
namespace {

// The shard TP rank `tp_rank` of `tp` holds of `spec`: the split dimension
// of the matrix view divided by `tp` (as layers::ParamBuffer lays it out).
Shard ShardOf(const layers::ParamSpec& spec, int tp_rank, int tp) {
  std::vector<int64_t> shape;
  for (int i = 0; i < spec.global_shape.rank(); ++i) shape.push_back(spec.global_shape.dim(i));
  Shard shard;
  MatrixDims(shape, &shard.rows, &shard.cols);
  if (spec.split == layers::TpSplit::kRows) {
    shard.rows /= tp;
    shard.split_start = tp_rank * shard.rows;
  } else if (spec.split == layers::TpSplit::kCols) {
    shard.cols /= tp;
    shard.split_start = tp_rank * shard.cols;
  }
  return shard;
}

}  // namespace

absl::Status ConvertCheckpoint(const std::string& src_iter_dir, const std::string& dst_dir,
                               int tp, int pp) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(src_iter_dir));
  const Manifest& src = reader->manifest();
  LOOM_ASSIGN_OR_RETURN(const layers::GptConfig model,
                        GptConfigFromProto(src.model(), absl::StrCat(reader->path(), "/manifest.pb")));
  absl::Status layout = layers::ValidateLayout(model, tp, false, pp, 1);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target-tensor-parallel-size=", tp, " --target-pipeline-parallel-size=", pp,
        " do not fit the model in ", src_iter_dir, ": ", layout.message()));
  }
  const bool moments = src.training().has_optimizer_state();
  const int64_t iteration = src.training().iteration();
  LOOM_RETURN_IF_ERROR(BeginCheckpoint(dst_dir, iteration));
  const int world = tp * pp;
  std::vector<ShardReport> reports;
  for (int pp_rank = 0; pp_rank < pp; ++pp_rank) {
    LOOM_ASSIGN_OR_RETURN(pipeline::LayerRange range,
                          pipeline::LayersOf(static_cast<int>(model.num_layers), pp, 1, pp_rank, 0));
    std::vector<layers::ParamSpec> specs;
    if (pp_rank == 0) {
      for (auto& s : layers::EmbeddingParamSpecs(model, tp)) specs.push_back(s);
    }
    for (int layer = range.first; layer < range.end(); ++layer) {
      for (auto& s : layers::BlockParamSpecs(model, layer)) specs.push_back(s);
    }
    if (pp_rank == pp - 1) {
      for (auto& s : layers::FinalNormParamSpecs(model)) specs.push_back(s);
      for (auto& s : layers::OutputLayerParamSpecs(model, tp)) specs.push_back(s);
    }
    for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
      const int rank = pp_rank * tp + tp_rank;  // DP 1: global rank order of comm::Grid
      std::vector<std::vector<float>> buffers;
      std::vector<Piece> pieces;
      for (const layers::ParamSpec& spec : specs) {
        if (spec.split == layers::TpSplit::kReplicated && tp_rank != 0) continue;
        const Placement pl = PlacementOf(spec, ShardOf(spec, tp_rank, tp));
        if (pl.rect.numel() == 0) continue;
        for (State state : {PARAM, EXP_AVG, EXP_AVG_SQ}) {
          if (state != PARAM && !moments) continue;
          buffers.emplace_back(static_cast<size_t>(pl.rect.numel()));
          LOOM_RETURN_IF_ERROR(reader->Read(spec.name, state, pl.rect, buffers.back().data()));
          pieces.push_back(Piece{spec.name, state, pl.global_shape, pl.rect, buffers.back().data()});
        }
      }
      LOOM_ASSIGN_OR_RETURN(
          ShardReport report,
          WriteShardFile(JoinPath(TmpDirFor(dst_dir, iteration), ShardFileName(rank, world)), rank,
                         pieces));
      reports.push_back(std::move(report));
    }
  }
  Manifest out = src;
  out.set_created_by(absl::StrCat(src.created_by(), src.created_by().empty() ? "" : "; ",
                                  "resharded by loom //checkpoint:convert from ", src_iter_dir));
  Layout* l = out.mutable_layout();
  l->set_tensor_parallel(tp);
  l->set_pipeline_parallel(pp);
  l->set_data_parallel(1);
  l->set_virtual_pipeline(1);
  l->set_sequence_parallel(false);
  l->set_distributed_optimizer(false);
  l->set_world_size(world);
  l->set_schedule("1f1b");
  LOOM_RETURN_IF_ERROR(MergeReports(reports, &out));
  return CommitCheckpoint(dst_dir, out, /*keep_last=*/0);
}

}  // namespace loom::checkpoint
