#ifndef LOOM_COMM_GRID_H_
#define LOOM_COMM_GRID_H_

// Rank arithmetic for a Megatron (tp, cp, dp, pp) layout and the split of the
// world communicator into its groups. TP varies fastest, then CP (context
// parallelism: the sequence split across ranks), then DP, then PP (Megatron's
// default order tp-cp-dp-pp):
//   global_rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
// so a TP group is `tp` consecutive ranks (one node's GPUs in practice). With
// cp = 1 this is the (tp, dp, pp) layout of before.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"

namespace loom::comm {

struct GridCoord {
  int tp_rank = 0;
  int dp_rank = 0;
  int pp_rank = 0;
  int cp_rank = 0;
  bool operator==(const GridCoord& o) const {
    return tp_rank == o.tp_rank && dp_rank == o.dp_rank && pp_rank == o.pp_rank &&
           cp_rank == o.cp_rank;
  }
};

// The model-parallel degrees; the data-parallel degree is what is left of the world.
struct GridDegrees {
  int tp = 1;
  int pp = 1;
  int cp = 1;
};

class Grid {
 public:
  // world_size must equal tp * pp * dp; every degree >= 1. The error names
  // the degrees and what they multiply to.
  static absl::StatusOr<Grid> Make(int world_size, const GridDegrees& degrees);
  static absl::StatusOr<Grid> Make(int world_size, int tp, int pp);  // cp = 1
  static absl::StatusOr<Grid> Make(int tp, int pp, int dp, int world_size);  // cp = 1

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int cp() const { return cp_; }
  int world_size() const { return tp_ * cp_ * dp_ * pp_; }

  GridCoord Coord(int global_rank) const;
  int GlobalRank(const GridCoord& c) const;

  // Members (global ranks, in group-rank order) of the groups containing
  // `global_rank`.
  std::vector<int> TpGroup(int global_rank) const;
  std::vector<int> DpGroup(int global_rank) const;
  std::vector<int> PpGroup(int global_rank) const;
  std::vector<int> CpGroup(int global_rank) const;
  // The ranks that hold the same parameters and share their gradient
  // reduction: DP x CP (Megatron's data-parallel-with-CP group); DpGroup when
  // cp = 1.
  std::vector<int> DpCpGroup(int global_rank) const;
  // First and last pipeline stage of the pipeline through global_rank (one
  // rank when pp == 1); empty if global_rank is an inner stage.
  std::vector<int> EmbeddingGroup(int global_rank) const;

 private:
  Grid(int tp, int pp, int dp, int cp) : tp_(tp), pp_(pp), dp_(dp), cp_(cp) {}
  int tp_, pp_, dp_, cp_;
};

// The communicators of one rank. `embedding` is null on inner pipeline
// stages; `cp` and `dp_cp` are null when cp = 1 (dp is then the gradient group).
struct ParallelGroups {
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> pp;
  std::unique_ptr<Communicator> embedding;
  std::unique_ptr<Communicator> cp;
  std::unique_ptr<Communicator> dp_cp;
};

// Collective over `world` (every rank calls it): splits it into the groups of
// `grid`. world.size() must equal grid.world_size().
absl::StatusOr<ParallelGroups> MakeParallelGroups(Communicator& world, const Grid& grid);

}  // namespace loom::comm

#endif  // LOOM_COMM_GRID_H_
