// A Mixtral-style model (the tiny Llama-style one with 4 experts, top-2, in
// every other layer; load-balancing and z losses on; hidden dropout on)
// trains to the same loss curve in every layout — TP (+SP), PP (1F1B and
// interleaved), DP, ZeRO-1 and all of them together — dropless and with a
// capacity that drops and pads (the same assignments in every layout). A
// checkpoint saved at TP 2 x PP 2 continues the curve at TP 1 and at DP 2
// (experts are named globally and reshard like dense weights), and at EP 2.
// Expert parallelism (EP 2, 4; with TP + SP and with PP; with ZeRO-1, which
// shards the experts over their expert-data-parallel replicas; with CP, whose
// ranks join those replicas) gives the same curve and the same global
// gradient norm, and a checkpoint saved at EP 2 x CP 2 continues it.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

// The trainer equivalence test's tolerance (1e-6 relative per step).
constexpr double kTolerance = 1e-6;
// The last step's global gradient norm (clipping's input), relative.
constexpr double kNormTolerance = 1e-6;
constexpr int kIters = 12;

using testing::Layout;

TrainConfig MoeConfig(const Layout& l, int iters, bool capacity) {
  TrainConfig c = testing::TinyLlamaConfig(l, iters);
  c.model.num_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.moe_layer_freq = 2;
  c.model.moe_aux_loss_coeff = 0.01f;
  c.model.moe_z_loss_coeff = 0.001f;
  if (capacity) {
    c.model.moe_expert_capacity_factor = 1.0f;
    c.model.moe_pad_expert_input_to_capacity = true;
  }
  return c;
}

Layout Ep(int ep, Layout l) {
  l.ep = ep;
  return l;
}

Layout Cp(int cp, Layout l) {
  l.cp = cp;
  return l;
}

using testing::Curve;

Curve TrainCurve(const Layout& l, bool capacity) {
  return testing::TrainCurve(MoeConfig(l, kIters, capacity), l);
}

void ExpectEveryLayoutMatches(bool capacity) {
  const Curve ref = TrainCurve(Layout{1, 1, 1}, capacity);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.3) << "the reference run must learn";
  for (const Layout& l : {
           Layout{2, 1, 1},
           Layout{2, 1, 1, 0, /*sp=*/true},
           Layout{1, 2, 1},
           Layout{1, 2, 1, 1, false, false, "interleaved"},
           Layout{1, 1, 2},
           Layout{1, 1, 2, 0, false, /*distributed=*/true},
           Layout{2, 2, 2, 0, /*sp=*/true, /*distributed=*/true},
           Ep(2, Layout{1, 1, 2}),                        // experts over both DP ranks
           Ep(2, Layout{1, 1, 4}),                        // EP 2 x 2 expert replicas
           Ep(4, Layout{1, 1, 4}),
           Ep(2, Layout{2, 1, 2, 0, /*sp=*/true}),        // EP x TP + SP
           Ep(2, Layout{1, 2, 2, 0, false, false, "1f1b", /*overlap=*/true}),  // EP x PP
           // ZeRO-1: experts sharded over their replicas (none here), the rest over DP
           Ep(2, Layout{1, 1, 2, 0, false, /*distributed=*/true}),
           Ep(2, Layout{2, 1, 2, 0, /*sp=*/true, /*distributed=*/true}),  // EP x TP + SP
           // 2 expert replicas, both overlaps
           Ep(2, Layout{1, 1, 4, 0, false, true, "1f1b", /*overlap=*/true, /*param_gather=*/true}),
           // ZeRO-2: the expert gradients' shards over their replicas, per micro-batch
           testing::OptimGrads(Ep(2, Layout{1, 1, 4, 0, false, false, "1f1b", /*overlap=*/true})),
           testing::OptimGrads(Ep(2, Layout{2, 1, 2, 0, /*sp=*/true})),  // EP x TP + SP
           // ZeRO-3: each part of a bucket gathered over its own group (experts over
           // their replicas, the rest over DP), the next unit prefetched.
           testing::OptimGradsParams(
               Ep(2, Layout{1, 1, 4, 0, false, false, "1f1b", true, /*param_gather=*/true})),
           testing::OptimGradsParams(Ep(2, Layout{2, 1, 2, 0, /*sp=*/true})),
       }) {
    const std::string what = (capacity ? "capacity 1, " : "dropless, ") + l.Describe();
    const Curve got = TrainCurve(l, capacity);
    testing::ExpectSameCurve(got.losses, ref.losses, 0, kTolerance, what);
    EXPECT_NEAR(got.grad_norm, ref.grad_norm, kNormTolerance * ref.grad_norm) << what;
  }
}

TEST(MoeTrainingTest, DroplessEveryLayoutGivesTheSameLossCurve) { ExpectEveryLayoutMatches(false); }

TEST(MoeTrainingTest, WithCapacityEveryLayoutGivesTheSameLossCurve) {
  ExpectEveryLayoutMatches(true);
}

// Context parallelism splits each sequence over the CP ranks; the router's
// load-balancing loss still counts the whole micro-batch (its statistics are
// summed over the CP group), so the curve is the single rank's. Dropless only.
// With EP each CP rank exchanges its own share of the tokens within its EP
// group (same CP rank), and the expert gradients are averaged over the DP / EP
// x CP ranks that hold the same experts: the same curve and gradient norm.
TEST(MoeTrainingTest, ContextParallelGivesTheSameLossCurve) {
  const Curve ref = TrainCurve(Layout{1, 1, 1}, false);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
  for (const Layout& l : {
           Cp(2, Layout{1, 1, 1}),                                         // CP alone
           Cp(2, Layout{2, 1, 1, 0, /*sp=*/true}),                         // CP x TP + SP
           Cp(2, Layout{1, 1, 2, 0, false, /*distributed=*/true}),         // CP x DP, ZeRO-1
           Cp(2, Layout{1, 2, 1}),                                         // CP x PP
           Cp(2, Ep(2, Layout{1, 1, 2})),                                  // EP x CP
           Cp(2, Ep(2, Layout{1, 1, 2, 0, false, /*distributed=*/true})),  // EP x CP, ZeRO-1
           Cp(2, Ep(2, Layout{1, 1, 4, 0, false, /*distributed=*/true})),  // 2 expert replicas
           Cp(2, testing::OptimGrads(Ep(2, Layout{1, 1, 4}))),             // EP x CP, ZeRO-2
           Cp(2, Ep(2, Layout{2, 1, 2, 0, /*sp=*/true})),                  // EP x CP x TP + SP
       }) {
    const std::string what = "dropless, " + l.Describe();
    const Curve got = TrainCurve(l, false);
    testing::ExpectSameCurve(got.losses, ref.losses, 0, kTolerance, what);
    EXPECT_NEAR(got.grad_norm, ref.grad_norm, kNormTolerance * ref.grad_norm) << what;
  }
  // A capacity would drop from each CP rank's share: refused, naming the flags.
  testing::RunResult refused = testing::Run(MoeConfig(Cp(2, Layout{1, 1, 1}), kIters, true),
                                            Cp(2, Layout{1, 1, 1}));
  EXPECT_FALSE(refused.status.ok());
  EXPECT_NE(refused.status.message().find("--moe-expert-capacity-factor"), std::string::npos)
      << refused.status;
  EXPECT_NE(refused.status.message().find("--context-parallel-size"), std::string::npos)
      << refused.status;
}

TEST(MoeTrainingTest, CheckpointReshardsExperts) {
  constexpr int kTotal = 8, kSaved = 4;
  const Layout whole{1, 1, 1};
  testing::RunResult ref = testing::Run(MoeConfig(whole, kTotal, false), whole);
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  // Saved with the experts split over TP and PP, or over EP (each expert then
  // written by its own rank), or over EP with ZeRO-1 (each expert's moments
  // in shards over its 2 replicas), or over EP x CP; loaded whole, with
  // ZeRO-1, over EP (with ZeRO-1 too) and over EP x CP.
  const Layout ep_zero1 = Ep(2, Layout{1, 1, 4, 0, false, /*distributed=*/true});
  // EP x CP with ZeRO-1: each expert written once though every CP rank holds it.
  const Layout ep_cp = Cp(2, Ep(2, Layout{1, 1, 2, 0, false, /*distributed=*/true}));
  // EP with ZeRO-3: each expert's values, too, in shards over its 2 replicas.
  const Layout ep_zero3 = testing::OptimGradsParams(Ep(2, Layout{1, 1, 4}));
  int n = 0;
  for (const Layout& saved :
       {Layout{2, 2, 1}, Ep(2, Layout{1, 1, 2}), ep_zero1, ep_cp, ep_zero3}) {
    const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/moe_ckpt" + std::to_string(n++);
    TrainConfig save = MoeConfig(saved, kTotal, false);
    save.save = dir;
    save.exit_interval = kSaved;
    testing::RunResult first = testing::Run(save, saved);
    ASSERT_TRUE(first.status.ok()) << first.status;
    for (const Layout& l : {Layout{1, 1, 1}, Layout{1, 1, 2, 0, false, true},
                            Ep(2, Layout{1, 1, 2}), ep_zero1, ep_cp, ep_zero3}) {
      TrainConfig load = MoeConfig(l, kTotal, false);
      load.load = dir;
      testing::RunResult second = testing::Run(load, l);
      ASSERT_TRUE(second.status.ok()) << l.Describe() << ": " << second.status;
      testing::ExpectSameCurve(second.losses, ref.losses, kSaved, kTolerance,
                               saved.Describe() + " -> " + l.Describe());
    }
    // A dense model cannot load it, and says which flag differs.
    TrainConfig dense = testing::TinyLlamaConfig(whole, kTotal);
    dense.load = dir;
    testing::RunResult refused = testing::Run(dense, whole);
    EXPECT_NE(refused.status.message().find("--num-experts is 4"), std::string::npos)
        << refused.status;
  }
}

// EP that cannot work is refused before any work, naming the flags.
TEST(MoeTrainingTest, BadExpertParallelSizesNameTheFlags) {
  TrainConfig c = MoeConfig(Ep(3, Layout{1, 1, 3}), 2, false);  // 3 does not divide 4 experts
  c.global_batch_size = 6;
  absl::Status s = Finalize(&c, 3);
  EXPECT_NE(s.message().find("--expert-model-parallel-size (3) must divide --num-experts (4)"),
            std::string::npos)
      << s;
  c = MoeConfig(Ep(2, Layout{1, 1, 1}), 2, false);  // DP 1
  EXPECT_FALSE(Finalize(&c, 1).ok());
  c = MoeConfig(Ep(2, Layout{1, 1, 2, 0, false, /*distributed=*/true}), 2, false);
  EXPECT_TRUE(Finalize(&c, 2).ok()) << "EP with ZeRO-1 is built";
  c = MoeConfig(Cp(2, Ep(2, Layout{1, 1, 2})), 2, false);
  EXPECT_TRUE(Finalize(&c, 4).ok()) << "EP with CP is built";
}

}  // namespace
}  // namespace loom::train
