// The communication overlaps of //train:gpt (#39) train to the single rank's
// loss curve and final gradient norm:
//   --tp-comm-overlap: the TP linear layers' sequence all-gather and
//     reduce-scatter as a ring, each block's GEMM while the next travels
//     (layers/tp_overlap.h), at TP 2 (and 4, GPT-2) + SP, with PP (1F1B and zb-h1),
//     DP 2 with overlapped reductions, GPT-2 and Llama-style;
//   --moe-a2a-overlap-chunks N: a Mixtral-style model's expert-parallel
//     dispatch/combine all-to-alls pipelined over N token chunks, at EP 2 and
//     4, with TP + SP and a dropping capacity.
// Each also against the same layout without the overlap (the same curve).
// Ranks are threads.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

// The trainer equivalence test's tolerance (1e-6 relative per step and for
// the last step's global gradient norm).
constexpr double kTolerance = 1e-6;
constexpr int kIters = 10;

using testing::Layout;

using testing::Curve;

struct Job {
  Layout layout;
  bool tp_overlap = false;
  int64_t a2a_chunks = 1;
};

Curve Train(const Job& run, bool llama, bool moe, bool capacity = false) {
  TrainConfig c = llama || moe ? testing::TinyLlamaConfig(run.layout, kIters)
                               : testing::TinyConfig(run.layout, kIters);
  c.global_batch_size = 16;
  c.tp_comm_overlap = run.tp_overlap;
  if (moe) {  // train/moe_test.cc's Mixtral-style model
    c.model.num_experts = 4;
    c.model.moe_router_topk = 2;
    c.model.moe_layer_freq = 2;
    c.model.moe_aux_loss_coeff = 0.01f;
    c.model.moe_z_loss_coeff = 0.001f;
    if (capacity) c.model.moe_expert_capacity_factor = 1.0f;
    c.model.moe_a2a_overlap_chunks = run.a2a_chunks;
  }
  return testing::TrainCurve(c, run.layout);
}

void ExpectSame(const Curve& got, const Curve& want, const std::string& what) {
  testing::ExpectSameCurveAndNorm(got, want, kTolerance, what);
}

Layout Sp(Layout l) {
  l.sp = true;
  return l;
}

void ExpectTpOverlapMatches(bool llama) {
  const Curve ref = Train(Job{Layout{1, 1, 1}}, llama, false);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.3) << "the reference run must learn";
  Layout zb = Sp(Layout{2, 2, 1});
  zb.schedule = "zb-h1";
  Layout dp = Sp(Layout{2, 1, 2});
  dp.overlap = true;
  for (const Layout& l : {Sp(Layout{2, 1, 1}), Sp(Layout{4, 1, 1}), Sp(Layout{2, 2, 1}), zb, dp}) {
    if (llama && l.tp == 4) continue;  // its 2 query groups split over TP 2 at most
    const std::string what = (llama ? "Llama-style " : "") + l.Describe() + " --tp-comm-overlap";
    const Curve got = Train(Job{l, true}, llama, false);
    ExpectSame(got, ref, what);
    ExpectSame(got, Train(Job{l, false}, llama, false), what + " vs without");
  }
}

TEST(CommOverlapTrainingTest, TpCommOverlapGivesTheSingleRankCurve) {
  ExpectTpOverlapMatches(false);
}
TEST(CommOverlapTrainingTest, TpCommOverlapGivesTheSingleRankCurveLlamaStyle) {
  ExpectTpOverlapMatches(true);
}

Layout Ep(int ep, Layout l) {
  l.ep = ep;
  return l;
}

TEST(CommOverlapTrainingTest, MoeAllToAllOverlapGivesTheSingleRankCurve) {
  for (bool capacity : {false, true}) {
    const Curve ref = Train(Job{Layout{1, 1, 1}}, true, true, capacity);
    ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
    for (const Job& run : {Job{Ep(2, Layout{1, 1, 2}), false, 2}, Job{Ep(4, Layout{1, 1, 4}), false, 3},
                           Job{Ep(2, Sp(Layout{2, 1, 2})), true, 2}}) {
      const std::string what = run.layout.Describe() + " --moe-a2a-overlap-chunks=" +
                               std::to_string(run.a2a_chunks) +
                               (run.tp_overlap ? " --tp-comm-overlap" : "") +
                               (capacity ? " capacity 1.0" : " dropless");
      ExpectSame(Train(run, true, true, capacity), ref, what);
    }
  }
}

}  // namespace
}  // namespace loom::train
