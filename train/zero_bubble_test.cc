// --pipeline-schedule=zb-h1 (#39): 1F1B's order with GptModel's split
// backward, each weight gradient deferred into the bubble (W after I(m + r)
// on stage r). It trains to the single rank's loss curve and final gradient
// norm at PP 2 and 4 (8 micro-batches a step; 4 with DP 2), with TP 2 + SP,
// DP 2 with the reductions overlapped with the backward (a unit's bucket
// starts at its last AfterBackward, which now comes at W), the distributed
// optimizer with both overlaps, and full and selective recomputation, for
// GPT-2 and the Llama-style model; and it is bit for bit 1F1B's run in the
// same layout (the same GEMMs on the same operands, in the same order per
// gradient). Ranks are threads (the real-process run is
// //tests:multiprocess_train_test's).

#include <cstring>
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
constexpr int kIters = 12;

using testing::Layout;

using testing::Curve;

TrainConfig Config(const Layout& l, bool llama, const std::string& recompute) {
  TrainConfig c = llama ? testing::TinyLlamaConfig(l, kIters) : testing::TinyConfig(l, kIters);
  c.global_batch_size = 16;  // micro-batches a step: 8, or 4 with DP 2 (>= PP)
  if (recompute == "full") c.model = layers::testing::Recompute{"full", "uniform", 1}.Apply(c.model);
  if (recompute == "selective") c.model = layers::testing::Recompute{"selective", "", 0}.Apply(c.model);
  return c;
}

Curve Train(const Layout& l, bool llama, const std::string& recompute = "") {
  return testing::TrainCurve(Config(l, llama, recompute), l);
}

Layout ZbH1(Layout l) {
  l.schedule = "zb-h1";
  return l;
}

struct Case {
  Layout layout;
  std::string recompute;
};

void ExpectSingleRankCurve(bool llama) {
  const Curve ref = Train(Layout{1, 1, 1}, llama);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.3) << "the reference run must learn";
  for (const Case& k : std::vector<Case>{
           {ZbH1(Layout{1, 2, 1}), ""},
           {ZbH1(Layout{1, 4, 1}), ""},
           {ZbH1(Layout{2, 2, 1, 0, /*sp=*/true}), ""},
           {ZbH1(Layout{1, 2, 2, 0, false, false, "", /*overlap=*/true}), ""},
           {ZbH1(Layout{2, 2, 2, 0, /*sp=*/true, false, "", /*overlap=*/true}), ""},
           {ZbH1(Layout{1, 2, 2, 0, false, /*distributed=*/true, "", true, /*param_gather=*/true}),
            ""},
           {ZbH1(Layout{2, 2, 2, 0, /*sp=*/true, false, "", /*overlap=*/true}), "full"},
           {ZbH1(Layout{1, 4, 1}), "selective"},
           // ZeRO-2 and ZeRO-3: a bucket stays bound until its writers' deferred Ws ran.
           {ZbH1(testing::OptimGrads(Layout{1, 2, 2, 0, false, false, "", true, true})), ""},
           {ZbH1(testing::OptimGradsParams(Layout{1, 2, 2, 0, false, false, "", true, true})), ""},
           {ZbH1(testing::OptimGradsParams(Layout{2, 2, 2, 0, /*sp=*/true, false, "", true, true})),
            "full"},
       }) {
    const std::string what = (llama ? "Llama-style " : "") + k.layout.Describe() +
                             (k.recompute.empty() ? "" : ", recompute " + k.recompute);
    const Curve got = Train(k.layout, llama, k.recompute);
    testing::ExpectSameCurveAndNorm(got, ref, kTolerance, what);
  }
}

TEST(ZeroBubbleTrainingTest, ZBH1GivesTheSingleRankCurve) { ExpectSingleRankCurve(false); }
TEST(ZeroBubbleTrainingTest, ZBH1GivesTheSingleRankCurveLlamaStyle) {
  ExpectSingleRankCurve(true);
}

// The same layout under 1F1B and ZB-H1: the same bits, every step.
TEST(ZeroBubbleTrainingTest, ZBH1IsBitwise1F1B) {
  for (const Layout& l : {Layout{1, 4, 1}, Layout{2, 2, 2, 0, /*sp=*/true, false, "1f1b", true}}) {
    const Curve one = Train(l, false);
    const Curve zb = Train(ZbH1(l), false);
    ASSERT_EQ(one.losses.size(), zb.losses.size());
    EXPECT_EQ(std::memcmp(one.losses.data(), zb.losses.data(), one.losses.size() * sizeof(double)),
              0)
        << l.Describe();
    EXPECT_EQ(one.grad_norm, zb.grad_norm) << l.Describe();
  }
}

}  // namespace
}  // namespace loom::train
