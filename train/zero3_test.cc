// ZeRO-3 (--data-parallel-sharding-strategy=optim_grads_params): parameters,
// gradients and optimizer state sharded over DP, each unit's parameters
// all-gathered before its forward and its backward. Every layout trains the
// single rank's loss curve and ends with its gradient norm (the ZeRO-2
// tests' 1e-6), GPT-2 (tied embedding, at PP 1 read by the first and the
// last unit) and Llama-style; checkpoints cross strategies and layouts; the
// combinations not supported are refused naming the flags.

#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "core/cpu/cpu_features.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

constexpr double kTolerance = 1e-6;  // as trainer_equivalence_test's ZeRO-2 layouts
constexpr int kIters = 20;

using testing::Layout;
using testing::OptimGradsParams;

TrainConfig Config(const Layout& l, bool llama, int iters = kIters) {
  return llama ? testing::TinyLlamaConfig(l, iters) : testing::TinyConfig(l, iters);
}

std::vector<double> Train(const TrainConfig& c, const Layout& l) {
  testing::RunResult r = testing::Run(c, l, nullptr, [](int, Trainer& t) {
    // Sharded at rest: no rank holds a whole parameter between steps.
    EXPECT_FALSE(t.model().params().holds_values());
    for (const layers::Param& p : t.model().params().params()) {
      EXPECT_FALSE(p.value.defined()) << p.spec->name << " is still bound after the step";
    }
  });
  EXPECT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
  return r.losses;
}

void ExpectLayoutsMatch(bool llama) {
  const Layout one{1, 1, 1};
  testing::RunResult ref = testing::Run(Config(one, llama), one);
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.5) << "the reference run must learn";
  const std::vector<Layout> layouts = {
      OptimGradsParams({1, 1, 2}),
      OptimGradsParams({1, 1, 2, 0, false, false, "1f1b", true, true}),  // both overlaps
      OptimGradsParams({1, 1, 4, 0, false, false, "1f1b", false, true}),
      OptimGradsParams({2, 1, 2, 0, true}),                               // TP + SP
      OptimGradsParams({2, 1, 2, 0, true, false, "1f1b", true, true}),
      OptimGradsParams({1, 2, 2, 0, false, false, "1f1b", true, true}),  // PP: tied over stages
      OptimGradsParams({1, 2, 2, 1, false, false, "interleaved", true, true}),
      OptimGradsParams({2, 2, 2, 0, true}),
      // CP 2 x DP 2: the parameters sharded over the gradient group DP x CP.
      OptimGradsParams({1, 1, 2, 0, false, false, "1f1b", true, true, /*cp=*/2}),
  };
  for (const Layout& l : layouts) {
    testing::ExpectSameCurve(Train(Config(l, llama), l), ref.losses, 0, kTolerance,
                             (llama ? "Llama-style " : "") + l.Describe());
  }
  // Recomputation: the recomputed forward gathers the units again (full,
  // uniform by 1 and by 2 layers, and block), with and without the prefetch.
  for (auto [method, layers, prefetch] :
       std::vector<std::tuple<layers::RecomputeMethod, int, bool>>{
           {layers::RecomputeMethod::kUniform, 1, false},
           {layers::RecomputeMethod::kUniform, 2, true},
           {layers::RecomputeMethod::kBlock, 1, true}}) {
    const Layout l = OptimGradsParams({1, 1, 2, 0, false, false, "1f1b", prefetch, prefetch});
    TrainConfig c = Config(l, llama);
    c.model.recompute_granularity = layers::RecomputeGranularity::kFull;
    c.model.recompute_method = method;
    c.model.recompute_num_layers = layers;
    testing::ExpectSameCurve(Train(c, l), ref.losses, 0, kTolerance,
                             absl::StrCat(llama ? "Llama-style " : "", l.Describe(),
                                          " recompute full ", core::EnumName(method), " ",
                                          layers));
  }
}

TEST(Zero3Test, EveryLayoutGivesTheSingleRankLossCurve) { ExpectLayoutsMatch(false); }
TEST(Zero3Test, EveryLayoutGivesTheSingleRankLossCurveLlamaStyle) { ExpectLayoutsMatch(true); }

// ZeRO-3 changes where the values live, not what is computed: the same
// layout under optim_grads (values whole, the f32 shards all-gathered after
// the step, the bf16 copy refreshed from them) gives the same losses bit for
// bit, in f32 and with --bf16 (the CPU's bf16 GEMMs read the copy each
// unit's gather converts). Not a GPT-2 at PP 1: there ZeRO-3 reduce-scatters
// the tied table's gradient after the head's and after the embedding's
// backward (ZeRO-2 once, after both), the same sum rounded differently
// (EveryLayoutGivesTheSingleRankLossCurve covers it).
TEST(Zero3Test, BitForBitOptimGradsInF32AndBf16) {
  const bool bf16_ok = core::cpu::CheckBf16GemmSupport("--bf16").ok();
  struct Case {
    Layout layout;
    bool llama;
  };
  for (const bool bf16 : {false, true}) {
    if (bf16 && !bf16_ok) continue;  // no bf16 GEMMs on this CPU: the f32 half still runs
    for (const Case& k : {Case{{1, 1, 2, 0, false, false, "1f1b", true, true}, true},
                          Case{{2, 1, 2, 0, true}, true}, Case{{1, 2, 2}, false}}) {
      const Layout zero2 = testing::OptimGrads(k.layout), zero3 = OptimGradsParams(k.layout);
      TrainConfig c2 = Config(zero2, k.llama, 6), c3 = Config(zero3, k.llama, 6);
      c2.bf16 = c3.bf16 = bf16;
      testing::RunResult a = testing::Run(c2, zero2);
      ASSERT_TRUE(a.status.ok()) << zero2.Describe() << ": " << a.status;
      const std::vector<double> b = Train(c3, zero3);
      ASSERT_EQ(b.size(), a.losses.size()) << zero3.Describe();
      for (size_t i = 0; i < b.size(); ++i) {
        EXPECT_EQ(b[i], a.losses[i]) << (bf16 ? "bf16 " : "f32 ") << (k.llama ? "Llama-style " : "")
                                     << zero3.Describe() << ", iteration " << i + 1;
      }
    }
  }
}

TEST(Zero3Test, EndsWithTheSingleRankGradientNorm) {
  auto final_norm = [](const Layout& l) {
    return testing::TrainCurve(testing::TinyConfig(l, 6), l).grad_norm;
  };
  const double ref = final_norm({1, 1, 1});
  ASSERT_GT(ref, 0);
  for (const Layout& l : {OptimGradsParams({1, 1, 2}),
                          OptimGradsParams({1, 1, 4, 0, false, false, "1f1b", true, true}),
                          OptimGradsParams({2, 2, 2, 0, true, false, "1f1b", true, true})}) {
    EXPECT_NEAR(final_norm(l), ref, kTolerance * ref) << l.Describe();
  }
}

// Evaluation runs forward-only passes over gathered units: the single
// rank's validation loss, and nothing left gathered afterwards (the kept
// prefetch is freed, not held until the next step).
TEST(Zero3Test, EvaluationGivesTheSingleRankLossAndKeepsNothingGathered) {
  auto validation = [](const Layout& l, bool zero3) {
    double loss = 0;
    int64_t left = -1;
    TrainConfig c = testing::TinyConfig(l, 4);
    c.eval_interval = 4;  // a validation split; one evaluation after the last step
    c.eval_iters = 2;
    testing::RunResult r = testing::Run(c, l, nullptr, [&](int rank, Trainer& t) {
      absl::StatusOr<double> v = t.Evaluate();
      ASSERT_TRUE(v.ok()) << l.Describe() << ": " << v.status();
      if (rank != 0) return;
      loss = *v;
      if (zero3) {
        EXPECT_GT(t.gradients().peak_gathered_bytes(), 0) << l.Describe();
        left = t.gradients().gathered_bytes();
      }
    });
    EXPECT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
    EXPECT_EQ(left, zero3 ? 0 : -1) << l.Describe() << ": bytes still gathered";
    return loss;
  };
  const double ref = validation({1, 1, 1}, false);
  ASSERT_GT(ref, 0);
  for (const Layout& l : {OptimGradsParams({1, 1, 2, 0, false, false, "1f1b", true, true}),
                          OptimGradsParams({1, 2, 2, 0, false, false, "1f1b", true, true})}) {
    EXPECT_NEAR(validation(l, true), ref, kTolerance * ref) << l.Describe();
  }
}

// A checkpoint saved under optim_grads_params holds whole tensors assembled
// from every rank's owned ranges (parameters and moments), so it loads under
// any strategy and layout, and any checkpoint loads under it.
constexpr double kCheckpointTolerance = 1e-5;  // as checkpoint_reshard_test

std::string Dir(const std::string& name) {
  const std::string d = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  EXPECT_TRUE(checkpoint::RemoveTree(d).ok());
  return d;
}

void Continue(const std::vector<double>& ref, const Layout& l, const std::string& load_dir,
              int from, const std::string& save_dir) {
  TrainConfig c = testing::TinyConfig(l, 40);
  c.load = load_dir;
  c.save = save_dir;
  c.save_interval = 10;
  c.checkpoint.load_iteration = from;
  testing::RunResult r = testing::Run(c, l);
  ASSERT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
  ASSERT_EQ(r.losses.size(), static_cast<size_t>(40 - from));
  for (int i = 0; i < 40 - from; ++i) {
    EXPECT_NEAR(r.losses[i], ref[from + i], kCheckpointTolerance * ref[from + i])
        << l.Describe() << " resumed at " << from << ", iteration " << from + i + 1;
  }
}

TEST(Zero3Test, CheckpointsCrossShardingStrategiesAndLayouts) {
  const Layout a{1, 1, 2};
  const std::string f = Dir("f"), g = Dir("g"), h = Dir("h"), i = Dir("i"), j = Dir("j"),
                    k = Dir("k"), m = Dir("m");
  TrainConfig c = testing::TinyConfig(a, 40);
  c.save = f;
  c.save_interval = 10;
  testing::RunResult ref = testing::Run(c, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), 40u);
  // no_shard -> optim_grads_params (DP 2) -> no_shard (DP 1), optim (DP 4),
  // optim_grads (TP 2 + SP x DP 2), optim_grads_params (PP 2 x DP 2);
  // optim (DP 4) -> optim_grads_params (TP 2 x DP 2).
  Continue(ref.losses, OptimGradsParams({1, 1, 2}), f, 10, g);
  Continue(ref.losses, Layout{1, 1, 1}, g, 20, h);
  Continue(ref.losses, Layout{1, 1, 4, 0, false, true}, g, 20, i);
  Continue(ref.losses, testing::OptimGrads({2, 1, 2, 0, true}), g, 20, j);
  Continue(ref.losses, OptimGradsParams({1, 2, 2}), g, 20, k);
  Continue(ref.losses, OptimGradsParams({2, 1, 2}), i, 30, m);
}

// What is not supported is refused before any work, naming the flags.
TEST(Zero3Test, RefusesWhatItDoesNotSupport) {
  auto finalize = [](TrainConfig* c, int world) {
    c->data_parallel_sharding_strategy = ShardingStrategy::kOptimGradsParams;
    return Finalize(c, world);
  };
  TrainConfig gpu = testing::TinyConfig(Layout{1, 1, 2}, 2);
  gpu.device = DeviceKind::kCuda;  // no GPU run has proven it
  absl::Status s = finalize(&gpu, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("--data-parallel-sharding-strategy=optim_grads_params with --device="),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--allow-unproven-gpu-sharding"), std::string::npos) << s;
  // Asked for: accepted (//train:sharded_device_test proves it on the fake device).
  TrainConfig allowed = testing::TinyConfig(Layout{1, 1, 2}, 2);
  allowed.device = DeviceKind::kCuda;
  allowed.allow_unproven_gpu_sharding = true;
  s = finalize(&allowed, 2);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(allowed.optimizer.shard_params);

  TrainConfig ok = testing::TinyConfig(Layout{1, 1, 2}, 2);
  EXPECT_TRUE(finalize(&ok, 2).ok());
  EXPECT_TRUE(ok.optimizer.shard_params);
  EXPECT_TRUE(ok.optimizer.distributed);
  // A misspelt strategy ("zero3") is the flag parser's to refuse (config_test).
}

}  // namespace
}  // namespace loom::train
