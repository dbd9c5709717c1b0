// The same model and data trained for 20 iterations in every layout —
// (TP, PP, DP) = (1,1,1), (2,1,1), (1,2,1), (1,1,2), (2,2,1), interleaved
// PP, sequence parallelism, the distributed optimizer, and the overlap of the
// data-parallel reductions and gathers with the computation, ZeRO-2
// (--data-parallel-sharding-strategy=optim_grads) — gives the same
// loss curve, with dropout on (counter-based masks make it layout-free). For
// GPT-2 and for a Llama-style model.

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

// Per-step losses of every layout stay within 1e-6 relative of the reference
// (measured: about 2e-9; the f32 rounding of the parallel sums differs, and
// Adam's division by sqrt(v) could amplify it over longer runs).
constexpr double kTolerance = 1e-6;
constexpr int kIters = 20;

using testing::Layout;

std::vector<double> Train(const Layout& l, bool llama) {
  testing::RunResult r = testing::Run(
      llama ? testing::TinyLlamaConfig(l, kIters) : testing::TinyConfig(l, kIters), l);
  EXPECT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
  return r.losses;
}

void ExpectEveryLayoutMatches(bool llama) {
  const std::vector<double> ref = Train({1, 1, 1}, llama);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.back(), ref.front() - 0.5) << "the reference run must learn";
  const std::vector<Layout> layouts = {
      {2, 1, 1},
      {1, 2, 1},
      {1, 1, 2},
      {2, 2, 1},
      {1, 1, 2, 0, false, true},           // distributed optimizer
      {2, 1, 2, 0, true, true},            // TP + SP + DP + distributed optimizer
      {1, 2, 1, 1, false, false, "interleaved"},
      {1, 2, 1, 0, false, false, "gpipe"},
      {1, 1, 2, 0, false, false, "1f1b", true},  // --overlap-grad-reduce
      {2, 2, 2, 0, true, false, "1f1b", true},   // TP + SP + PP + DP, overlapped
      // ZeRO-1 with its reduce-scatters overlapped with the backward, then
      // also its parameter all-gathers with the next forward.
      {1, 1, 2, 0, false, true, "1f1b", true},
      {1, 1, 2, 0, false, true, "1f1b", true, true},
      {1, 2, 2, 1, false, true, "interleaved", true, true},  // tied embedding over PP (GPT-2)
      {2, 2, 2, 0, true, true, "1f1b", true, true},
      // ZeRO-2: gradients reduce-scattered in every micro-batch, only the
      // owned shard kept; DP 2-4, with TP + SP, PP, the tied embedding over
      // PP (GPT-2) and both overlaps.
      testing::OptimGrads({1, 1, 2}),
      testing::OptimGrads({1, 1, 4, 0, false, false, "1f1b", true}),
      testing::OptimGrads({2, 1, 2, 0, true}),
      testing::OptimGrads({1, 2, 2, 0, false, false, "1f1b", true, true}),
      testing::OptimGrads({1, 2, 2, 1, false, false, "interleaved", true}),
      testing::OptimGrads({2, 2, 2, 0, true, false, "1f1b", true, true}),
  };
  for (const Layout& l : layouts) {
    testing::ExpectSameCurve(Train(l, llama), ref, 0, kTolerance,
                             (llama ? "Llama-style " : "") + l.Describe());
  }
}

TEST(TrainerEquivalenceTest, EveryLayoutGivesTheSameLossCurve) { ExpectEveryLayoutMatches(false); }
// --overlap-param-gather leaves the last step's gather to the next forward;
// Train() must finish it, or what a caller then reads (the final parameters,
// an export, a generated text) mixes updated and stale shards. Every DP
// replica holds the same parameters when Train() returns.
TEST(TrainerEquivalenceTest, OverlappedParamGatherHasLandedWhenTrainReturns) {
  const Layout l{1, 1, 2, 0, false, true, "1f1b", true, true};
  std::vector<std::vector<float>> params(l.world());
  absl::Mutex mu;
  testing::RunResult r =
      testing::Run(testing::TinyConfig(l, 3), l, nullptr, [&](int rank, Trainer& t) {
        const core::Tensor& flat = t.model().params().flat_values();
        const float* p = flat.data<float>();
        std::vector<float> v(p, p + flat.numel());
        absl::MutexLock lock(&mu);
        params[rank] = std::move(v);
      });
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t i = 0; i < params[0].size(); ++i) {
    ASSERT_EQ(params[0][i], params[1][i])
        << "parameter element " << i << " of " << params[0].size();
  }
}

// ZeRO-2 ends with the single rank's gradient norm (recomputed from the
// final gradients, through the optimizer's view of the owned shard) as
// ZeRO-1 and no_shard do, at DP 2 and 4, with TP + SP and PP.
TEST(TrainerEquivalenceTest, OptimGradsEndsWithTheSingleRankGradientNorm) {
  auto final_norm = [](const Layout& l) {
    return testing::TrainCurve(testing::TinyConfig(l, 6), l).grad_norm;
  };
  const double ref = final_norm({1, 1, 1});
  ASSERT_GT(ref, 0);
  for (const Layout& l : {Layout{1, 1, 2, 0, false, true}, testing::OptimGrads({1, 1, 2}),
                          testing::OptimGrads({1, 1, 4, 0, false, false, "1f1b", true}),
                          testing::OptimGrads({2, 2, 2, 0, true, false, "1f1b", true})}) {
    EXPECT_NEAR(final_norm(l), ref, kTolerance * ref) << l.Describe();
  }
}

// RMSNorm, RoPE, SwiGLU, 2 query groups, untied output layer (no tied sum
// over PP: each end stage owns its own table), no biases.
TEST(TrainerEquivalenceTest, EveryLayoutGivesTheSameLossCurveLlamaStyle) {
  ExpectEveryLayoutMatches(true);
}

// A Llama-style checkpoint (RoPE: no position table; [2, F·h] SwiGLU weights
// split by columns; GQA rows by whole groups; the untied output layer) saved
// at TP2 x PP2 loads into other layouts and continues the curve.
TEST(TrainerEquivalenceTest, LlamaStyleCheckpointLoadsIntoOtherLayouts) {
  constexpr int kTotal = 12, kSaved = 6;
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/llama_ckpt";
  const Layout a{2, 2, 1};
  TrainConfig c = testing::TinyLlamaConfig(a, kTotal);
  c.save = dir;
  c.save_interval = kSaved;
  testing::RunResult ref = testing::Run(c, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kTotal));
  for (const Layout& l : {Layout{1, 1, 1}, Layout{1, 1, 2, 0, false, true},
                          Layout{2, 1, 1, 0, true}, Layout{1, 4, 1}}) {
    TrainConfig r = testing::TinyLlamaConfig(l, kTotal);
    r.load = dir;
    r.checkpoint.load_iteration = kSaved;
    testing::RunResult got = testing::Run(r, l);
    ASSERT_TRUE(got.status.ok()) << l.Describe() << ": " << got.status;
    testing::ExpectSameCurve(got.losses, ref.losses, kSaved, kTolerance, l.Describe());
  }
}

}  // namespace
}  // namespace loom::train
