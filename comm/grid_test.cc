#include "comm/grid.h"

#include <set>

#include "comm/testing/ranks_as_threads.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace loom::comm {
namespace {

TEST(Grid, MegatronOrder) {
  // 16 ranks, tp=2, pp=4 -> dp=2 (Megatron's docstring example).
  auto grid = Grid::Make(16, 2, 4);
  ASSERT_TRUE(grid.ok()) << grid.status();
  EXPECT_EQ(grid->dp(), 2);
  EXPECT_EQ(grid->TpGroup(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(grid->DpGroup(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(grid->PpGroup(5), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(grid->EmbeddingGroup(1), (std::vector<int>{1, 13}));
  EXPECT_EQ(grid->EmbeddingGroup(13), (std::vector<int>{1, 13}));
  EXPECT_TRUE(grid->EmbeddingGroup(5).empty());
  for (int g = 0; g < 16; ++g) EXPECT_EQ(grid->GlobalRank(grid->Coord(g)), g);
  GridCoord c = grid->Coord(11);
  EXPECT_EQ(c.tp_rank, 1);
  EXPECT_EQ(c.dp_rank, 1);
  EXPECT_EQ(c.pp_rank, 2);
}

TEST(Grid, ContextParallelOrder) {
  // 16 ranks, tp=2, cp=2, pp=2 -> dp=2; TP fastest, then CP, DP, PP.
  auto grid = Grid::Make(16, GridDegrees{.tp = 2, .pp = 2, .cp = 2});
  ASSERT_TRUE(grid.ok()) << grid.status();
  EXPECT_EQ(grid->dp(), 2);
  EXPECT_EQ(grid->world_size(), 16);
  EXPECT_EQ(grid->TpGroup(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(grid->CpGroup(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(grid->DpGroup(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(grid->PpGroup(5), (std::vector<int>{5, 13}));
  EXPECT_EQ(grid->DpCpGroup(5), (std::vector<int>{1, 3, 5, 7}));
  const GridCoord c = grid->Coord(14);
  EXPECT_EQ(c.tp_rank, 0);
  EXPECT_EQ(c.cp_rank, 1);
  EXPECT_EQ(c.dp_rank, 1);
  EXPECT_EQ(c.pp_rank, 1);
  for (int g = 0; g < 16; ++g) EXPECT_EQ(grid->GlobalRank(grid->Coord(g)), g);
  // cp = 1 is the layout of before, rank for rank.
  auto plain = Grid::Make(16, 2, 4);
  auto same = Grid::Make(16, GridDegrees{.tp = 2, .pp = 4, .cp = 1});
  ASSERT_TRUE(plain.ok() && same.ok());
  for (int g = 0; g < 16; ++g) {
    EXPECT_EQ(plain->Coord(g), same->Coord(g));
    EXPECT_EQ(plain->DpGroup(g), same->DpCpGroup(g));
    EXPECT_EQ(same->CpGroup(g), (std::vector<int>{g}));
  }
  auto bad = Grid::Make(12, GridDegrees{.tp = 2, .pp = 1, .cp = 4});
  EXPECT_NE(bad.status().message().find("tp * pp * cp = 2 * 1 * 4 = 8"), std::string::npos)
      << bad.status();
  EXPECT_FALSE(Grid::Make(8, GridDegrees{.tp = 1, .pp = 1, .cp = 0}).ok());
}

TEST(Grid, SinglePipelineStage) {
  auto grid = Grid::Make(4, 2, 1);
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(grid->EmbeddingGroup(3), (std::vector<int>{3}));
}

TEST(Grid, BadDegrees) {
  auto g = Grid::Make(6, 4, 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("not divisible by tp * pp"), std::string::npos);
  EXPECT_FALSE(Grid::Make(8, 0, 1).ok());
  EXPECT_FALSE(Grid::Make(2, 2, 2, 7).ok());
}

// The groups built by Split agree with the arithmetic, and work.
void CheckParallelGroups(const Grid& grid) {
  const int n = grid.world_size();
  absl::Status s = testing::RunRanksAsThreads(n, [&](int r, Communicator* w) -> absl::Status {
    auto groups = MakeParallelGroups(*w, grid);
    if (!groups.ok()) return groups.status();
    struct G {
      Communicator* c;
      std::vector<int> want;
    };
    std::vector<G> gs = {{groups->tp.get(), grid.TpGroup(r)},
                         {groups->dp.get(), grid.DpGroup(r)},
                         {groups->pp.get(), grid.PpGroup(r)},
                         {groups->embedding.get(), grid.EmbeddingGroup(r)}};
    if (grid.cp() > 1) {
      gs.push_back({groups->cp.get(), grid.CpGroup(r)});
      gs.push_back({groups->dp_cp.get(), grid.DpCpGroup(r)});
    } else if (groups->cp != nullptr || groups->dp_cp != nullptr) {
      return absl::InternalError("cp = 1 made CP groups");
    }
    for (G& g : gs) {
      if (g.want.empty()) {
        if (g.c != nullptr) return absl::InternalError("inner stage got an embedding group");
        continue;
      }
      if (g.c == nullptr || g.c->size() != static_cast<int>(g.want.size())) {
        return absl::InternalError("wrong group size");
      }
      // All-gather the global ranks: must equal the arithmetic's list.
      auto in = core::Tensor::Empty({1}, core::DType::kI32);
      auto out = core::Tensor::Empty({g.c->size()}, core::DType::kI32);
      in->data<int32_t>()[0] = r;
      LOOM_RETURN_IF_ERROR(g.c->AllGather(*in, *out)->Wait());
      for (int i = 0; i < g.c->size(); ++i) {
        if (out->data<int32_t>()[i] != g.want[i]) {
          return absl::InternalError("group " + g.c->group_name() + " has the wrong members");
        }
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(Grid, ParallelGroupsOnLocalBackend) {
  auto grid = Grid::Make(8, 2, 2);  // dp = 2
  ASSERT_TRUE(grid.ok());
  CheckParallelGroups(*grid);
}

TEST(Grid, ContextParallelGroupsOnLocalBackend) {
  auto grid = Grid::Make(8, GridDegrees{.tp = 2, .pp = 1, .cp = 2});  // dp = 2
  ASSERT_TRUE(grid.ok());
  CheckParallelGroups(*grid);
  auto with_pp = Grid::Make(8, GridDegrees{.tp = 1, .pp = 2, .cp = 2});  // dp = 2
  ASSERT_TRUE(with_pp.ok());
  CheckParallelGroups(*with_pp);
}

}  // namespace
}  // namespace loom::comm
