#include "comm/grid.h"

#include "absl/strings/str_cat.h"

namespace loom::comm {

absl::StatusOr<Grid> Grid::Make(int world_size, const GridDegrees& d) {
  if (d.tp < 1 || d.pp < 1 || d.cp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("grid: --tp=", d.tp, ", --pp=", d.pp,
                                                   " and --cp=", d.cp, " must all be >= 1"));
  }
  const int model = d.tp * d.pp * d.cp;
  if (world_size % model != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grid: world size ", world_size, " is not divisible by tp * pp", d.cp > 1 ? " * cp" : "",
        " = ", d.tp, " * ", d.pp, d.cp > 1 ? absl::StrCat(" * ", d.cp) : "", " = ", model,
        "; choose degrees whose product divides the number of ranks"));
  }
  return Grid(d.tp, d.pp, world_size / model, d.cp);
}

absl::StatusOr<Grid> Grid::Make(int world_size, int tp, int pp) {
  return Make(world_size, GridDegrees{tp, pp, 1});
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
  return Grid(tp, pp, dp, 1);
}

GridCoord Grid::Coord(int g) const {
  GridCoord c;
  c.tp_rank = g % tp_;
  c.cp_rank = (g / tp_) % cp_;
  c.dp_rank = (g / (tp_ * cp_)) % dp_;
  c.pp_rank = g / (tp_ * cp_ * dp_);
  return c;
}

int Grid::GlobalRank(const GridCoord& c) const {
  return ((c.pp_rank * dp_ + c.dp_rank) * cp_ + c.cp_rank) * tp_ + c.tp_rank;
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

std::vector<int> Grid::CpGroup(int g) const {
  GridCoord c = Coord(g);
  std::vector<int> out;
  for (c.cp_rank = 0; c.cp_rank < cp_; ++c.cp_rank) out.push_back(GlobalRank(c));
  return out;
}

std::vector<int> Grid::DpCpGroup(int g) const {
  GridCoord c = Coord(g);
  std::vector<int> out;
  for (c.dp_rank = 0; c.dp_rank < dp_; ++c.dp_rank) {
    for (c.cp_rank = 0; c.cp_rank < cp_; ++c.cp_rank) out.push_back(GlobalRank(c));
  }
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
        " ranks but the grid (tp=", grid.tp(), ", cp=", grid.cp(), ", pp=", grid.pp(), ", dp=",
        grid.dp(), ") needs ", grid.world_size()));
  }
  const int g = world.rank();
  const GridCoord c = grid.Coord(g);
  ParallelGroups out;
  // Colors: the index of the group among its kind (what its members share);
  // keys: the rank within it.
  const int tp = grid.tp(), cp = grid.cp(), dp = grid.dp();
  auto split = [&](int color, int key, const char* name,
                   std::unique_ptr<Communicator>* into) -> absl::Status {
    auto child = world.Split(color, key, name);
    if (!child.ok()) return child.status();
    *into = std::move(*child);
    return absl::OkStatus();
  };
  absl::Status s = split((c.pp_rank * dp + c.dp_rank) * cp + c.cp_rank, c.tp_rank, "tp", &out.tp);
  if (s.ok()) s = split((c.pp_rank * cp + c.cp_rank) * tp + c.tp_rank, c.dp_rank, "dp", &out.dp);
  if (s.ok()) s = split((c.dp_rank * cp + c.cp_rank) * tp + c.tp_rank, c.pp_rank, "pp", &out.pp);
  const bool in_embedding = c.pp_rank == 0 || c.pp_rank == grid.pp() - 1;
  if (s.ok()) {
    s = split(in_embedding ? (c.dp_rank * cp + c.cp_rank) * tp + c.tp_rank : -1, c.pp_rank,
              "embedding", &out.embedding);
  }
  if (s.ok() && cp > 1) {
    s = split((c.pp_rank * dp + c.dp_rank) * tp + c.tp_rank, c.cp_rank, "cp", &out.cp);
    if (s.ok()) {
      s = split(c.pp_rank * tp + c.tp_rank, c.dp_rank * cp + c.cp_rank, "dp_cp", &out.dp_cp);
    }
  }
  if (!s.ok()) return s;
  return out;
}

}  // namespace loom::comm
