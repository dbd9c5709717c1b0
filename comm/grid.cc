#include "comm/grid.h"

#include "absl/strings/str_cat.h"

namespace loom::comm {

absl::StatusOr<Grid> Grid::Make(int world_size, int tp, int pp) {
  if (tp < 1 || pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grid: --tp=", tp, " and --pp=", pp, " must both be >= 1"));
  }
  if (world_size % (tp * pp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grid: world size ", world_size, " is not divisible by tp * pp = ", tp, " * ", pp, " = ",
        tp * pp, "; choose --tp/--pp whose product divides the number of ranks"));
  }
  return Grid(tp, pp, world_size / (tp * pp));
}

absl::StatusOr<Grid> Grid::Make(int tp, int pp, int dp, int world_size) {
  if (tp < 1 || pp < 1 || dp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("grid: tp=", tp, ", pp=", pp, ", dp=", dp,
                                                   " must all be >= 1"));
  }
  if (tp * pp * dp != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("grid: tp * pp * dp = ", tp, " * ", pp, " * ",
                                                   dp, " = ", tp * pp * dp,
                                                   " but the world has ", world_size, " ranks"));
  }
  return Grid(tp, pp, dp);
}

GridCoord Grid::Coord(int g) const {
  GridCoord c;
  c.tp_rank = g % tp_;
  c.dp_rank = (g / tp_) % dp_;
  c.pp_rank = g / (tp_ * dp_);
  return c;
}

int Grid::GlobalRank(const GridCoord& c) const {
  return c.pp_rank * (dp_ * tp_) + c.dp_rank * tp_ + c.tp_rank;
}

std::vector<int> Grid::TpGroup(int g) const {
  GridCoord c = Coord(g);
  std::vector<int> out;
  for (c.tp_rank = 0; c.tp_rank < tp_; ++c.tp_rank) out.push_back(GlobalRank(c));
  return out;
}

std::vector<int> Grid::DpGroup(int g) const {
  GridCoord c = Coord(g);
  std::vector<int> out;
  for (c.dp_rank = 0; c.dp_rank < dp_; ++c.dp_rank) out.push_back(GlobalRank(c));
  return out;
}

std::vector<int> Grid::PpGroup(int g) const {
  GridCoord c = Coord(g);
  std::vector<int> out;
  for (c.pp_rank = 0; c.pp_rank < pp_; ++c.pp_rank) out.push_back(GlobalRank(c));
  return out;
}

std::vector<int> Grid::EmbeddingGroup(int g) const {
  GridCoord c = Coord(g);
  if (c.pp_rank != 0 && c.pp_rank != pp_ - 1) return {};
  std::vector<int> out;
  c.pp_rank = 0;
  out.push_back(GlobalRank(c));
  if (pp_ > 1) {
    c.pp_rank = pp_ - 1;
    out.push_back(GlobalRank(c));
  }
  return out;
}

absl::StatusOr<ParallelGroups> MakeParallelGroups(Communicator& world, const Grid& grid) {
  if (world.size() != grid.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MakeParallelGroups: the world communicator has ", world.size(),
        " ranks but the grid (tp=", grid.tp(), ", pp=", grid.pp(), ", dp=", grid.dp(), ") needs ",
        grid.world_size()));
  }
  const int g = world.rank();
  const GridCoord c = grid.Coord(g);
  ParallelGroups out;
  // Colors: the index of the group among its kind; keys: the rank within it.
  auto tp = world.Split(c.pp_rank * grid.dp() + c.dp_rank, c.tp_rank, "tp");
  if (!tp.ok()) return tp.status();
  out.tp = std::move(*tp);
  auto dp = world.Split(c.pp_rank * grid.tp() + c.tp_rank, c.dp_rank, "dp");
  if (!dp.ok()) return dp.status();
  out.dp = std::move(*dp);
  auto pp = world.Split(c.dp_rank * grid.tp() + c.tp_rank, c.pp_rank, "pp");
  if (!pp.ok()) return pp.status();
  out.pp = std::move(*pp);
  const bool in_embedding = c.pp_rank == 0 || c.pp_rank == grid.pp() - 1;
  auto emb = world.Split(in_embedding ? c.dp_rank * grid.tp() + c.tp_rank : -1, c.pp_rank,
                         "embedding");
  if (!emb.ok()) return emb.status();
  out.embedding = std::move(*emb);
  return out;
}

}  // namespace loom::comm
