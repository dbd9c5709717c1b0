#include "pipeline/layer_assignment.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom::pipeline {
namespace {

TEST(LayerAssignmentTest, MegatronInterleavedLayout) {
  // L=16, P=4, v=2: 2 layers per chunk; chunk c of stage r is virtual stage c*4 + r.
  auto r0c0 = LayersOf(16, 4, 2, 0, 0);
  auto r0c1 = LayersOf(16, 4, 2, 0, 1);
  auto r3c1 = LayersOf(16, 4, 2, 3, 1);
  ASSERT_TRUE(r0c0.ok() && r0c1.ok() && r3c1.ok());
  EXPECT_EQ(r0c0->first, 0);
  EXPECT_EQ(r0c0->count, 2);
  EXPECT_EQ(r0c1->first, 8);
  EXPECT_EQ(r3c1->first, 14);
  EXPECT_EQ(r3c1->end(), 16);
}

TEST(LayerAssignmentTest, EveryLayerOwnedExactlyOnce) {
  for (int pp : {1, 2, 3, 4}) {
    for (int vp : {1, 2, 3}) {
      const int layers = pp * vp * 2;
      std::vector<int> owners(layers, 0);
      for (int r = 0; r < pp; ++r) {
        for (int c = 0; c < vp; ++c) {
          auto range = LayersOf(layers, pp, vp, r, c);
          ASSERT_TRUE(range.ok()) << range.status();
          for (int l = range->first; l < range->end(); ++l) owners[l]++;
        }
      }
      for (int l = 0; l < layers; ++l) EXPECT_EQ(owners[l], 1) << "layer " << l;
    }
  }
}

TEST(LayerAssignmentTest, PlainSplitWithoutInterleaving) {
  auto r = LayersOf(12, 3, 1, 2, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 8);
  EXPECT_EQ(r->count, 4);
}

TEST(LayerAssignmentTest, IndivisibleLayersNameTheFlags) {
  absl::Status s = ValidateLayerSplit(10, 4, 2);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--num-layers=10"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("--pipeline-model-parallel-size=4"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("--num-layers-per-virtual-pipeline-stage"), absl::string_view::npos)
      << s;
  EXPECT_FALSE(LayersOf(10, 4, 2, 0, 0).ok());
}

TEST(LayerAssignmentTest, OutOfRangeStageOrChunk) {
  EXPECT_FALSE(LayersOf(16, 4, 2, 4, 0).ok());
  EXPECT_FALSE(LayersOf(16, 4, 2, 0, 2).ok());
  EXPECT_FALSE(LayersOf(16, 4, 2, -1, 0).ok());
}

// The V (zbv, dualpipev) over 4 stages and 16 layers: stage r holds virtual stages r and
// 7 − r, two layers each; so stage 0 has the first and the last two layers. Interleaving gives
// LayersOf's ranges.
TEST(LayerAssignmentTest, ChunkLayersFollowTheSchedulesPlacement) {
  ScheduleOptions v;
  v.kind = ScheduleKind::kDualPipeV;
  v.pp = 4;
  v.vp = 2;
  const int want[4][2] = {{0, 14}, {2, 12}, {4, 10}, {6, 8}};
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 2; ++c) {
      absl::StatusOr<LayerRange> got = ChunkLayers(v, 16, r, c);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->first, want[r][c]) << "stage " << r << " chunk " << c;
      EXPECT_EQ(got->count, 2);
    }
  }
  ScheduleOptions interleaved = v;
  interleaved.kind = ScheduleKind::kInterleaved;
  EXPECT_EQ(ChunkLayers(interleaved, 16, 0, 1)->first, LayersOf(16, 4, 2, 0, 1)->first);
  EXPECT_FALSE(ChunkLayers(v, 10, 0, 0).ok());  // 10 layers do not split over 8 chunks
}

}  // namespace
}  // namespace loom::pipeline
