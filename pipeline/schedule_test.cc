#include "pipeline/schedule.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace loom::pipeline {
namespace {

ScheduleOptions Opts(ScheduleKind kind, int pp, int vp, int m, int g = 0) {
  ScheduleOptions o;
  o.kind = kind;
  o.pp = pp;
  o.vp = vp;
  o.micro_batches = m;
  o.microbatch_group_size = g;
  return o;
}

bool Mentions(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

// All valid option sets of a small grid.
std::vector<ScheduleOptions> Grid() {
  std::vector<ScheduleOptions> out;
  for (int pp = 1; pp <= 5; ++pp) {
    for (int m = 1; m <= 12; ++m) {
      out.push_back(Opts(ScheduleKind::kGPipe, pp, 1, m));
      out.push_back(Opts(ScheduleKind::k1F1B, pp, 1, m));
      for (int vp = 2; vp <= 4 && pp >= 2; ++vp) {
        for (int g = pp; g <= m; ++g) {
          if (m % g == 0) out.push_back(Opts(ScheduleKind::kInterleaved, pp, vp, m, g));
        }
      }
    }
  }
  return out;
}

TEST(ScheduleTest, ParseScheduleKind) {
  EXPECT_EQ(*ParseScheduleKind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(*ParseScheduleKind("1F1B"), ScheduleKind::k1F1B);
  EXPECT_EQ(*ParseScheduleKind("interleaved"), ScheduleKind::kInterleaved);
  absl::StatusOr<ScheduleKind> bad = ParseScheduleKind("zero-bubble");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(bad.status(), "--pipeline-schedule")) << bad.status();
  EXPECT_TRUE(Mentions(bad.status(), "gpipe|1f1b|interleaved")) << bad.status();
}

TEST(ScheduleTest, ConstraintErrorsNameTheFlags) {
  struct Case {
    ScheduleOptions options;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      // M not a multiple of G (default G = P).
      {Opts(ScheduleKind::kInterleaved, 4, 2, 6),
       {"--micro-batches = 6", "--microbatch-group-size-per-virtual-pipeline-stage = 4",
        "multiple"}},
      // Explicit G that does not divide M.
      {Opts(ScheduleKind::kInterleaved, 2, 2, 8, 3), {"--micro-batches = 8", "= 3"}},
      // G outside [P, M].
      {Opts(ScheduleKind::kInterleaved, 4, 2, 8, 2),
       {"--microbatch-group-size-per-virtual-pipeline-stage = 2", "[4, 8]"}},
      {Opts(ScheduleKind::kInterleaved, 4, 2, 2), {"--micro-batches", "[4, 2]"}},
      // Interleaving with one stage.
      {Opts(ScheduleKind::kInterleaved, 1, 2, 4), {"--pipeline-model-parallel-size", "interleaved"}},
      {Opts(ScheduleKind::kInterleaved, 4, 1, 4), {"--virtual-pipeline-model-parallel-size"}},
      {Opts(ScheduleKind::k1F1B, 4, 2, 4), {"--virtual-pipeline-model-parallel-size", "1f1b"}},
      {Opts(ScheduleKind::kGPipe, 4, 1, 4, 4),
       {"--microbatch-group-size-per-virtual-pipeline-stage"}},
      {Opts(ScheduleKind::k1F1B, 4, 1, 0), {"--micro-batches = 0"}},
      {Opts(ScheduleKind::k1F1B, 0, 1, 4), {"--pipeline-model-parallel-size"}},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateScheduleOptions(c.options);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    for (const std::string& m : c.mentions) EXPECT_TRUE(Mentions(s, m)) << s << " lacks " << m;
    EXPECT_FALSE(BuildSchedule(c.options).ok());
  }
}

TEST(ScheduleTest, WarmupCounts) {
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(WarmupForwards(Opts(ScheduleKind::k1F1B, 4, 1, 8), r), 4 - r - 1);
    EXPECT_EQ(WarmupForwards(Opts(ScheduleKind::k1F1B, 4, 1, 2), r), std::min(4 - r - 1, 2));
    EXPECT_EQ(WarmupForwards(Opts(ScheduleKind::kGPipe, 4, 1, 8), r), 8);
    // 2(P - r - 1) + (v - 1) G, capped at M v.
    EXPECT_EQ(WarmupForwards(Opts(ScheduleKind::kInterleaved, 4, 2, 8), r), 2 * (3 - r) + 4);
    EXPECT_EQ(WarmupForwards(Opts(ScheduleKind::kInterleaved, 4, 2, 8, 8), r),
              std::min(2 * (3 - r) + 8, 16));
  }
  EXPECT_EQ(WarmupForwards(Opts(ScheduleKind::kInterleaved, 4, 2, 4), 0), 8);  // capped
}

TEST(ScheduleTest, ComputeOrderStartsWithWarmupForwards) {
  for (const ScheduleOptions& o : Grid()) {
    for (int r = 0; r < o.pp; ++r) {
      const std::vector<Action> order = ComputeOrder(o, r);
      int leading_forwards = 0;
      while (leading_forwards < static_cast<int>(order.size()) &&
             order[leading_forwards].kind == ActionKind::kForward) {
        ++leading_forwards;
      }
      const int warmup = WarmupForwards(o, r);
      const int total = o.micro_batches * o.vp;
      // The steady state starts with one more forward, unless everything was warm-up.
      EXPECT_EQ(leading_forwards, warmup < total ? warmup + 1 : total)
          << ScheduleKindName(o.kind) << " P=" << o.pp << " M=" << o.micro_batches
          << " stage " << r;
    }
  }
}

TEST(ScheduleTest, InterleavedChunkOrder) {
  const ScheduleOptions o = Opts(ScheduleKind::kInterleaved, 4, 2, 8);
  // Forwards: micro-batches 0-3 on chunk 0, 0-3 on chunk 1, then 4-7 on chunk 0, ...
  std::vector<std::pair<int, int>> want_fwd = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1},
                                               {2, 1}, {3, 1}, {4, 0}, {5, 0}};
  for (int k = 0; k < static_cast<int>(want_fwd.size()); ++k) {
    ChunkStep s = NthStep(o, k, /*forward=*/true);
    EXPECT_EQ(s.micro_batch, want_fwd[k].first) << k;
    EXPECT_EQ(s.chunk, want_fwd[k].second) << k;
  }
  // Backwards visit the chunks in reverse.
  EXPECT_EQ(NthStep(o, 0, false).chunk, 1);
  EXPECT_EQ(NthStep(o, 4, false).chunk, 0);
  EXPECT_EQ(NthStep(o, 4, false).micro_batch, 0);
  EXPECT_EQ(NthStep(o, 9, false).micro_batch, 5);
}

TEST(ScheduleTest, OneFOneBStageZeroGolden) {
  absl::StatusOr<Schedule> s = BuildSchedule(Opts(ScheduleKind::k1F1B, 4, 1, 8));
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<std::string> names;
  for (const Action& a : s->stages[0]) names.push_back(ToShortString(a));
  EXPECT_EQ(absl::StrJoin(names, " "),
            "F0.0 SA0.0>1 F1.0 SA1.0>1 F2.0 SA2.0>1 F3.0 SA3.0>1 RG0.0<1 B0.0 "
            "F4.0 SA4.0>1 RG1.0<1 B1.0 F5.0 SA5.0>1 RG2.0<1 B2.0 F6.0 SA6.0>1 RG3.0<1 B3.0 "
            "F7.0 SA7.0>1 RG4.0<1 B4.0 RG5.0<1 B5.0 RG6.0<1 B6.0 RG7.0<1 B7.0");
}

TEST(ScheduleTest, EveryForwardAndBackwardExactlyOncePerStage) {
  for (const ScheduleOptions& o : Grid()) {
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(static_cast<int>(s->stages.size()), o.pp);
    for (int r = 0; r < o.pp; ++r) {
      std::map<std::pair<int, int>, int> fwd, bwd;
      for (const Action& a : s->stages[r]) {
        if (a.kind == ActionKind::kForward) fwd[{a.micro_batch, a.chunk}]++;
        if (a.kind == ActionKind::kBackward) bwd[{a.micro_batch, a.chunk}]++;
      }
      ASSERT_EQ(static_cast<int>(fwd.size()), o.micro_batches * o.vp);
      ASSERT_EQ(static_cast<int>(bwd.size()), o.micro_batches * o.vp);
      for (const auto& [key, n] : fwd) EXPECT_EQ(n, 1);
      for (const auto& [key, n] : bwd) EXPECT_EQ(n, 1);
    }
  }
}

TEST(ScheduleTest, CommunicationCountsAndPeers) {
  for (const ScheduleOptions& o : Grid()) {
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    ASSERT_TRUE(s.ok());
    // Over all stages: one activation and one grad per micro-batch per virtual-stage boundary.
    const int boundaries = o.pp == 1 ? 0 : o.pp * o.vp - 1;
    std::map<ActionKind, int> counts;
    for (int r = 0; r < o.pp; ++r) {
      for (const Action& a : s->stages[r]) {
        counts[a.kind]++;
        if (!IsCompute(a.kind)) {
          EXPECT_NE(a.peer, r);
          EXPECT_GE(a.peer, 0);
          EXPECT_LT(a.peer, o.pp);
        }
      }
    }
    for (ActionKind k : {ActionKind::kSendActivation, ActionKind::kRecvActivation,
                         ActionKind::kSendGrad, ActionKind::kRecvGrad}) {
      EXPECT_EQ(counts[k], boundaries * o.micro_batches);
    }
  }
}

TEST(ScheduleTest, SingleStageHasNoCommunication) {
  absl::StatusOr<Schedule> s = BuildSchedule(Opts(ScheduleKind::k1F1B, 1, 1, 3));
  ASSERT_TRUE(s.ok());
  std::vector<std::string> names;
  for (const Action& a : s->stages[0]) names.push_back(ToShortString(a));
  EXPECT_EQ(absl::StrJoin(names, " "), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
}

}  // namespace
}  // namespace loom::pipeline
