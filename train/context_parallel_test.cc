// Context parallelism (--context-parallel-size) reproduces the CP = 1 loss
// curve: CP 2 and 4 alone, and with TP (+SP), PP (1F1B, GPipe, interleaved),
// DP and the distributed optimizer, for GPT-2 (learned positions: the position ids follow the
// chunks) and a Llama-style model (RoPE phases follow the chunks), with
// hidden and attention dropout on (masks at global positions). A checkpoint
// saved under CP (ZeRO-1 sharded over DP x CP) continues the curve at CP = 1
// and the other way round. Ranks are threads (the local backend).

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

// The trainer equivalence test's tolerance: per-step losses within 1e-6
// relative (the ring's log-sum-exp merge orders the f32 sums differently).
constexpr double kTolerance = 1e-6;
constexpr int kIters = 12;

using testing::Layout;

Layout Cp(int cp, int tp = 1, int pp = 1, int dp = 1, bool sp = false, bool distributed = false) {
  Layout l{tp, pp, dp, 0, sp, distributed};
  l.cp = cp;
  return l;
}

Layout Sched(Layout l, const std::string& schedule) {
  l.schedule = schedule;
  if (schedule == "interleaved") l.vp_layers = 1;
  return l;
}

TrainConfig Config(const Layout& l, bool llama, int iters) {
  TrainConfig c = llama ? testing::TinyLlamaConfig(l, iters) : testing::TinyConfig(l, iters);
  c.attention_dropout = 0.1f;  // the ring draws the whole-sequence kernel's masks
  return c;
}

std::vector<double> Train(const Layout& l, bool llama) {
  testing::RunResult r = testing::Run(Config(l, llama, kIters), l);
  EXPECT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
  return r.losses;
}

void ExpectEveryCpLayoutMatches(bool llama) {
  const std::vector<double> ref = Train(Layout{1, 1, 1}, llama);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.back(), ref.front() - 0.3) << "the reference run must learn";
  for (const Layout& l : {
           Cp(2),
           Cp(4),
           Cp(2, /*tp=*/2, 1, 1, /*sp=*/true),
           Cp(2, 1, /*pp=*/2),
           Sched(Cp(2, 1, /*pp=*/2), "gpipe"),
           Sched(Cp(2, 1, /*pp=*/2), "interleaved"),  // 2 chunks of 1 layer per stage
           Cp(2, 1, 1, /*dp=*/2),
           Cp(2, 1, 1, /*dp=*/2, false, /*distributed=*/true),  // ZeRO-1 over DP x CP
           testing::OptimGrads(Cp(2, 1, 1, /*dp=*/2)),           // ZeRO-2 over DP x CP
           Cp(2, 2, 2, 2, /*sp=*/true, /*distributed=*/true),   // all of them: 16 ranks
       }) {
    testing::ExpectSameCurve(Train(l, llama), ref, 0, kTolerance,
                             (llama ? "Llama-style " : "") + l.Describe());
  }
}

TEST(ContextParallelTest, EveryCpLayoutGivesTheSameLossCurve) { ExpectEveryCpLayoutMatches(false); }

TEST(ContextParallelTest, EveryCpLayoutGivesTheSameLossCurveLlamaStyle) {
  ExpectEveryCpLayoutMatches(true);
}

// Parameters are the same on every CP rank: a checkpoint does not depend on
// CP, so one saved at CP 2 x DP 2 (moments sharded over the 4 ranks)
// resumes at CP 1 and one saved at CP 1 resumes at CP 4, both on the curve
// of the run that never stopped.
TEST(ContextParallelTest, CheckpointsMoveBetweenCpSizes) {
  constexpr int kTotal = 8, kSaved = 4;
  // The run that never stops (the same --train-iters: it sizes the data).
  testing::RunResult whole = testing::Run(Config(Layout{1, 1, 1}, false, kTotal), Layout{1, 1, 1});
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  const std::vector<double>& ref = whole.losses;
  const struct {
    Layout save, load;
  } cases[] = {{Cp(2, 1, 1, 2, false, true), Cp(1)}, {Cp(1), Cp(4)}};
  int n = 0;
  for (const auto& c : cases) {
    const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/cp_ckpt" + std::to_string(n++);
    TrainConfig save = Config(c.save, false, kTotal);
    save.save = dir;
    save.exit_interval = kSaved;  // saves, then stops
    testing::RunResult first = testing::Run(save, c.save);
    ASSERT_TRUE(first.status.ok()) << c.save.Describe() << ": " << first.status;
    testing::ExpectSameCurve(first.losses, std::vector<double>(ref.begin(), ref.begin() + kSaved),
                             0, kTolerance, "saving " + c.save.Describe());

    TrainConfig load = Config(c.load, false, kTotal);
    load.load = dir;
    testing::RunResult second = testing::Run(load, c.load);
    ASSERT_TRUE(second.status.ok()) << c.load.Describe() << ": " << second.status;
    testing::ExpectSameCurve(second.losses, std::vector<double>(ref.begin(), ref.begin() + kTotal),
                             kSaved, kTolerance, c.save.Describe() + " -> " + c.load.Describe());
  }
}

// Layouts that cannot work are refused before any work, naming the flags.
TEST(ContextParallelTest, BadLayoutsNameTheFlags) {
  TrainConfig c = testing::TinyConfig(Cp(3), 4);  // seq 16: not a multiple of 2 x 3
  absl::Status s = Finalize(&c, 3);
  EXPECT_NE(s.message().find("--seq-length (16)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--context-parallel-size"), std::string::npos) << s;

  c = testing::TinyConfig(Cp(2), 4);
  s = Finalize(&c, 3);  // 3 ranks cannot hold CP 2
  EXPECT_NE(s.message().find("--context-parallel-size (2)"), std::string::npos) << s;

  c = testing::TinyConfig(Cp(4, 4, 1, 1, /*sp=*/true), 4);  // 16 / 4 = 4 rows over TP 4: ok
  EXPECT_TRUE(Finalize(&c, 16).ok());
  c = testing::TinyConfig(Cp(8, 4, 1, 1, /*sp=*/true), 4);  // 16 / 8 = 2 rows over TP 4
  s = Finalize(&c, 32);
  EXPECT_NE(s.message().find("--seq-length / --context-parallel-size (2)"), std::string::npos)
      << s;

  c = testing::TinyConfig(Cp(2), 4);
  c.device = DeviceKind::kCuda;
  s = Finalize(&c, 2);
  EXPECT_NE(s.message().find("--device=cpu only"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom::train
