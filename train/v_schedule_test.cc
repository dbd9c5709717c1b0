// --pipeline-schedule=zbv and dualpipev in //train:gpt (#39): the layers
// placed in a V (stage r holds virtual stages r and 2P-1-r, so stage 0 has
// the embedding, the tied output layer and the loss), GptModel's split
// backward for their I/W actions, dualpipev's full backwards in its F&B
// steps. Both train to the single rank's loss curve and final gradient norm,
// and evaluate to its validation loss (the V's forward-only schedule), at
// PP 2 and 4, with TP 2 + SP, CP 2, DP 2 with the reductions overlapped, the
// distributed optimizer with both overlaps, recomputation, GPT-2 and the
// Llama-style model. Ranks are threads.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/test_util.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

// The trainer equivalence test's tolerances (1e-6 relative per step and for
// the last step's global gradient norm).
constexpr double kTolerance = 1e-6;
constexpr int kIters = 10;

using testing::Layout;

using testing::Curve;

struct Case {
  Layout layout;
  int layers = 4;  // 2 x PP divides it: one chunk of layers / (2 PP) per arm of the V
  std::string recompute;
};

Curve Train(const Case& k, bool llama) {
  TrainConfig c = llama ? testing::TinyLlamaConfig(k.layout, kIters)
                        : testing::TinyConfig(k.layout, kIters);
  c.model.num_layers = k.layers;
  c.global_batch_size = 16;  // micro-batches a step: 8, or 4 with DP 2 (>= 2 PP)
  c.eval_interval = kIters;  // one evaluation, after the last step
  c.eval_iters = 2;
  if (k.recompute == "full") {
    c.model = layers::testing::Recompute{"full", "uniform", 1}.Apply(c.model);
  }
  return testing::TrainCurve(c, k.layout);
}

Layout V(Layout l, const std::string& schedule) {
  l.schedule = schedule;
  return l;
}

void ExpectSingleRankCurve(const std::string& schedule, bool llama) {
  std::vector<Case> cases = {
      {V(Layout{1, 2, 1}, schedule), 4, ""},
      {V(Layout{2, 2, 1, 0, /*sp=*/true}, schedule), 4, ""},
      {V(Layout{1, 2, 2, 0, false, false, "", /*overlap=*/true}, schedule), 4, ""},
      {V(Layout{1, 2, 2, 0, false, /*distributed=*/true, "", true, /*param_gather=*/true},
         schedule),
       4, ""},
      {V(Layout{2, 2, 1, 0, /*sp=*/true}, schedule), 4, "full"},
      {V(Layout{1, 2, 1, 0, false, false, "", false, false, /*cp=*/2}, schedule), 4, ""},
      {V(Layout{1, 4, 1}, schedule), 8, ""},
      // ZeRO-2 and ZeRO-3 under the V's split backward.
      {V(testing::OptimGrads(Layout{1, 2, 2, 0, false, false, "", true, true}), schedule), 4, ""},
      {V(testing::OptimGradsParams(Layout{1, 2, 2, 0, false, false, "", true, true}), schedule), 4,
       ""},
  };
  for (int layers : {4, 8}) {
    const Curve ref = Train(Case{Layout{1, 1, 1}, layers, ""}, llama);
    ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.3) << "the reference run must learn";
    for (const Case& k : cases) {
      if (k.layers != layers) continue;
      const std::string what = (llama ? "Llama-style " : "") + k.layout.Describe() +
                               (k.recompute.empty() ? "" : ", recompute " + k.recompute);
      const Curve got = Train(k, llama);
      testing::ExpectSameCurveAndNorm(got, ref, kTolerance, what);
      EXPECT_NEAR(got.eval_loss, ref.eval_loss, kTolerance * ref.eval_loss) << what;
    }
  }
}

TEST(VScheduleTrainingTest, ZBVGivesTheSingleRankCurve) { ExpectSingleRankCurve("zbv", false); }
TEST(VScheduleTrainingTest, DualPipeVGivesTheSingleRankCurve) {
  ExpectSingleRankCurve("dualpipev", false);
}
TEST(VScheduleTrainingTest, DualPipeVGivesTheSingleRankCurveLlamaStyle) {
  ExpectSingleRankCurve("dualpipev", true);
}

}  // namespace
}  // namespace loom::train
