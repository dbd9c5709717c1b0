#include "checkpoint/rank_state.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::checkpoint {

Placement PlacementOf(const layers::ParamSpec& spec, const Shard& shard) {
  Placement out;
  const core::Shape& g = spec.global_shape;
  for (int i = 0; i < g.rank(); ++i) out.global_shape.push_back(g.dim(i));
  if (spec.unpadded_rows > 0) out.global_shape[0] = spec.unpadded_rows;
  int64_t rows, cols;
  MatrixDims(out.global_shape, &rows, &cols);
  switch (spec.split) {
    case layers::TpSplit::kRows:
      out.rect = Region::Rect(shard.split_start, shard.rows, 0, shard.cols);
      break;
    case layers::TpSplit::kCols:
      out.rect = Region::Rect(0, shard.rows, shard.split_start, shard.cols);
      break;
    case layers::TpSplit::kReplicated:
      out.rect = Region::Rect(0, shard.rows, 0, shard.cols);
      break;
  }
  // Vocabulary padding rows lie past the unpadded global shape: not stored.
  if (out.rect.row_start + out.rect.num_rows > rows) {
    out.rect.num_rows = std::max<int64_t>(0, rows - out.rect.row_start);
    out.rect.flat_end = out.rect.num_rows * out.rect.num_cols;
  }
  return out;
}

Placement PlacementOf(const layers::Param& p) {
  const core::Shape& local = p.shape;
  const int64_t local_rows = local.rank() == 0 ? 1 : local.dim(0);
  const int64_t local_cols = local_rows == 0 ? 0 : local.numel() / local_rows;
  return PlacementOf(*p.spec, Shard{p.split_start, local_rows, local_cols});
}

namespace {

bool Owns(const layers::Param& p, const RankView& v) {
  if (p.spec->split == layers::TpSplit::kReplicated && v.tp_rank != 0) return false;
  return !p.tied_copy;  // saved where the original lives (the first stage)
}

// A part of parameter p's local flat range [0, numel) that the moments cover,
// clipped to its stored rectangle: `region` (flat [begin, end) of the
// rectangle), at `at` in the moment buffers.
struct MomentPart {
  Region region;
  int64_t at;
};
std::vector<MomentPart> MomentParts(const layers::Param& p, const RankView& v,
                                    const Placement& pl) {
  std::vector<MomentPart> parts;
  int64_t base = 0;  // where the range starts in the moments
  for (const auto& [first, last] : v.moment_ranges) {
    const int64_t begin = std::max(p.offset, first) - p.offset;
    const int64_t end = std::min({p.offset + p.shape.numel(), last, p.offset + pl.rect.flat_end}) -
                        p.offset;
    if (begin < end) {
      Region r = pl.rect;
      r.flat_begin = begin;
      r.flat_end = end;
      parts.push_back({r, base + p.offset + begin - first});
    }
    base += last - first;
  }
  return parts;
}

// The moment buffers, in the order their pieces are saved and read.
struct Moment {
  State state;
  core::Tensor* buffer;
};
std::array<Moment, 2> Moments(const RankView& v) {
  return {Moment{EXP_AVG, v.exp_avg}, Moment{EXP_AVG_SQ, v.exp_avg_sq}};
}

}  // namespace

std::vector<Piece> PiecesToSave(const RankView& v, bool save_optimizer) {
  std::vector<Piece> pieces;
  const bool moments = save_optimizer && v.exp_avg != nullptr && v.exp_avg_sq != nullptr;
  for (const layers::Param& p : v.params->params()) {
    if (!Owns(p, v)) continue;
    const Placement pl = PlacementOf(p);
    const int replica = p.spec->expert ? v.expert_dp_rank : v.dp_rank;
    if (v.values != nullptr) {  // ZeRO-3: this rank's ranges of it, as its moments
      for (const MomentPart& part : MomentParts(p, v, pl)) {
        pieces.push_back(Piece{p.spec->name, PARAM, pl.global_shape, part.region,
                               v.values->data<float>() + part.at});
      }
    } else if (replica == 0 && pl.rect.numel() > 0) {
      pieces.push_back(Piece{p.spec->name, PARAM, pl.global_shape, pl.rect,
                             p.master.data<float>()});
    }
    if (!moments || (!v.distributed_optimizer && replica != 0)) continue;
    for (const MomentPart& part : MomentParts(p, v, pl)) {
      for (const Moment& m : Moments(v)) {
        pieces.push_back(Piece{p.spec->name, m.state, pl.global_shape, part.region,
                               m.buffer->data<float>() + part.at});
      }
    }
  }
  return pieces;
}

absl::Status LoadRank(CheckpointReader& reader, const RankView& v, bool load_optimizer) {
  const bool moments = load_optimizer && v.exp_avg != nullptr && v.exp_avg_sq != nullptr &&
                       reader.manifest().training().has_optimizer_state();
  // Every read of this rank, done as one batch (one pass per file, its
  // checksum checked before ReadMany returns). Elements no read covers are
  // zeroed: the padding of each parameter, and the moments outside the
  // stored ranges.
  std::vector<CheckpointReader::Request> requests;
  std::vector<std::pair<int64_t, int64_t>> moment_ranges;  // [at, +n) in the moment buffers
  if (v.values != nullptr) {  // padding and the rows never stored stay zero
    std::memset(v.values->data<float>(), 0, v.values->nbytes());
  }
  for (layers::Param& p : v.params->params()) {
    const Placement pl = PlacementOf(p);
    const TensorInfo* t = reader.Find(p.spec->name, PARAM);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", reader.path(),
                                              " has no parameter ", p.spec->name));
    }
    if (std::vector<int64_t>(t->global_shape().begin(), t->global_shape().end()) !=
        pl.global_shape) {
      std::string want, got;
      for (int64_t d : pl.global_shape) absl::StrAppend(&want, want.empty() ? "" : ",", d);
      for (int64_t d : t->global_shape()) absl::StrAppend(&got, got.empty() ? "" : ",", d);
      return absl::FailedPreconditionError(
          absl::StrCat("parameter ", p.spec->name, " has global shape [", got,
                       "] in checkpoint ", reader.path(), " but [", want, "] from the flags"));
    }
    if (v.values != nullptr) {  // ZeRO-3: this rank's ranges (zeroed whole below)
      for (const MomentPart& part : MomentParts(p, v, pl)) {
        requests.push_back({p.spec->name, PARAM, part.region, v.values->data<float>() + part.at});
      }
    } else {
      float* value = p.master.data<float>();
      // The stored rectangle is the local shard's leading rows: zero the rest.
      if (pl.rect.numel() < p.shape.numel()) {
        std::memset(value + pl.rect.numel(), 0,
                    static_cast<size_t>(p.shape.numel() - pl.rect.numel()) * sizeof(float));
      }
      requests.push_back({p.spec->name, PARAM, pl.rect, value});
    }
    if (!moments) continue;
    for (const MomentPart& part : MomentParts(p, v, pl)) {
      for (const Moment& m : Moments(v)) {
        requests.push_back({p.spec->name, m.state, part.region, m.buffer->data<float>() + part.at});
      }
      moment_ranges.push_back({part.at, part.region.numel()});
    }
  }
  if (moments) {
    // Zero the gaps between the ranges read (not the whole buffers: that
    // would be a second pass over all of them).
    std::sort(moment_ranges.begin(), moment_ranges.end());
    for (const Moment& m : Moments(v)) {
      float* data = m.buffer->data<float>();
      const int64_t total = m.buffer->numel();
      int64_t at = 0;
      for (const auto& [begin, n] : moment_ranges) {
        if (begin > at) std::memset(data + at, 0, static_cast<size_t>(begin - at) * sizeof(float));
        at = std::max(at, begin + n);
      }
      if (total > at) std::memset(data + at, 0, static_cast<size_t>(total - at) * sizeof(float));
    }
  }
  return reader.ReadMany(requests);
}

}  // namespace loom::checkpoint
