#include "pipeline/schedule.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  EXPECT_TRUE(Mentions(bad.status(), "gpipe | 1f1b | interleaved | zb-h1 | zbv | dualpipev"))
      << bad.status();
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
    EXPECT_EQ(BuildForwardOnlySchedule(c.options).status(), s);
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

std::string Describe(const ScheduleOptions& o) {
  return absl::StrCat(ScheduleKindName(o.kind), " P=", o.pp, " v=", o.vp, " M=", o.micro_batches,
                      " G=", EffectiveGroupSize(o));
}

std::string Names(const std::vector<Action>& list) {
  std::vector<std::string> names;
  for (const Action& a : list) names.push_back(ToShortString(a));
  return absl::StrJoin(names, " ");
}

TEST(ForwardOnlyScheduleTest, EveryForwardExactlyOnceInTheTrainingOrder) {
  for (const ScheduleOptions& o : Grid()) {
    absl::StatusOr<Schedule> s = BuildForwardOnlySchedule(o);
    ASSERT_TRUE(s.ok()) << Describe(o) << ": " << s.status();
    EXPECT_EQ(s->options.kind, o.kind);
    ASSERT_EQ(static_cast<int>(s->stages.size()), o.pp);
    for (int r = 0; r < o.pp; ++r) {
      std::vector<Action> forwards, training_forwards;
      for (const Action& a : s->stages[r]) {
        EXPECT_TRUE(a.kind == ActionKind::kForward || a.kind == ActionKind::kSendActivation ||
                    a.kind == ActionKind::kRecvActivation)
            << Describe(o) << " stage " << r << ": " << ToString(a);
        if (a.kind == ActionKind::kForward) forwards.push_back(a);
      }
      for (const Action& a : ComputeOrder(o, r)) {
        if (a.kind == ActionKind::kForward) training_forwards.push_back(a);
      }
      // Same (micro-batch, chunk) order as training, so each appears exactly once.
      EXPECT_EQ(forwards, training_forwards) << Describe(o) << " stage " << r;
      ASSERT_EQ(static_cast<int>(forwards.size()), o.micro_batches * o.vp);
      for (int k = 0; k < static_cast<int>(forwards.size()); ++k) {
        const ChunkStep want = NthStep(o, k, /*forward=*/true);
        EXPECT_EQ(forwards[k], Forward(want.micro_batch, want.chunk)) << Describe(o) << " " << k;
      }
    }
  }
}

TEST(ForwardOnlyScheduleTest, ReceiveBeforeAndSendRightAfterEachForward) {
  for (const ScheduleOptions& o : Grid()) {
    absl::StatusOr<Schedule> s = BuildForwardOnlySchedule(o);
    ASSERT_TRUE(s.ok());
    const int p = o.pp, last_vs = o.pp * o.vp - 1;
    for (int r = 0; r < p; ++r) {
      const std::vector<Action>& list = s->stages[r];
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& f = list[i];
        if (f.kind != ActionKind::kForward) continue;
        const int vs = f.chunk * p + r;
        // The receive of its input: earlier in the list, from the previous virtual stage.
        const Action recv{ActionKind::kRecvActivation, f.micro_batch, f.chunk, (vs - 1 + p) % p};
        const size_t at = std::find(list.begin(), list.end(), recv) - list.begin();
        if (vs == 0 || p == 1) {
          EXPECT_EQ(at, list.size()) << Describe(o) << " stage " << r << ": " << ToString(f);
        } else {
          EXPECT_LT(at, i) << Describe(o) << " stage " << r << ": " << ToString(f);
        }
        // The send of its output: in the batch right after it.
        const Action send{ActionKind::kSendActivation, f.micro_batch, f.chunk, (vs + 1) % p};
        bool sent = false;
        for (size_t j = i + 1; j < list.size() && !IsCompute(list[j].kind); ++j) {
          sent = sent || list[j] == send;
        }
        EXPECT_EQ(sent, vs != last_vs && p > 1)
            << Describe(o) << " stage " << r << ": " << ToString(f);
      }
    }
  }
}

TEST(ForwardOnlyScheduleTest, SendsAndReceivesPairUpInOrderOnEveryLink) {
  for (const ScheduleOptions& o : Grid()) {
    absl::StatusOr<Schedule> s = BuildForwardOnlySchedule(o);
    ASSERT_TRUE(s.ok());
    const int p = o.pp;
    // Per link (src, dst): the (micro-batch, virtual stage of the sender) of each message.
    std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> sent, received;
    int sends = 0, recvs = 0;
    for (int r = 0; r < p; ++r) {
      for (const Action& a : s->stages[r]) {
        const int vs = a.chunk * p + r;
        if (a.kind == ActionKind::kSendActivation) {
          EXPECT_EQ(a.peer, (vs + 1) % p);
          sent[{r, a.peer}].push_back({a.micro_batch, vs});
          ++sends;
        } else if (a.kind == ActionKind::kRecvActivation) {
          EXPECT_EQ(a.peer, (vs - 1) % p);
          received[{a.peer, r}].push_back({a.micro_batch, vs - 1});
          ++recvs;
        }
        if (!IsCompute(a.kind)) {
          EXPECT_NE(a.peer, r);
        }
      }
    }
    EXPECT_EQ(sent, received) << Describe(o);
    const int boundaries = p == 1 ? 0 : p * o.vp - 1;
    EXPECT_EQ(sends, boundaries * o.micro_batches) << Describe(o);
    EXPECT_EQ(recvs, boundaries * o.micro_batches) << Describe(o);
  }
}

TEST(ForwardOnlyScheduleTest, Goldens) {
  // 1F1B (and GPipe) with M < P: receive, forward, then a batch with the send and the next
  // receive.
  absl::StatusOr<Schedule> s = BuildForwardOnlySchedule(Opts(ScheduleKind::k1F1B, 3, 1, 2));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Names(s->stages[0]), "F0.0 SA0.0>1 F1.0 SA1.0>1");
  EXPECT_EQ(Names(s->stages[1]), "RA0.0<0 F0.0 SA0.0>2 RA1.0<0 F1.0 SA1.0>2");
  EXPECT_EQ(Names(s->stages[2]), "RA0.0<1 F0.0 RA1.0<1 F1.0");
  absl::StatusOr<Schedule> gpipe = BuildForwardOnlySchedule(Opts(ScheduleKind::kGPipe, 3, 1, 2));
  ASSERT_TRUE(gpipe.ok());
  EXPECT_EQ(gpipe->stages, s->stages);

  // Interleaved, G = P: stage 0 receives chunk 1's input in the batch right before it.
  s = BuildForwardOnlySchedule(Opts(ScheduleKind::kInterleaved, 2, 2, 4));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Names(s->stages[0]),
            "F0.0 SA0.0>1 F1.0 SA1.0>1 RA0.1<1 F0.1 SA0.1>1 RA1.1<1 F1.1 SA1.1>1 "
            "F2.0 SA2.0>1 F3.0 SA3.0>1 RA2.1<1 F2.1 SA2.1>1 RA3.1<1 F3.1 SA3.1>1");
  EXPECT_EQ(Names(s->stages[1]),
            "RA0.0<0 F0.0 SA0.0>0 RA1.0<0 F1.0 SA1.0>0 RA0.1<0 F0.1 RA1.1<0 F1.1 "
            "RA2.0<0 F2.0 SA2.0>0 RA3.0<0 F3.0 SA3.0>0 RA2.1<0 F2.1 RA3.1<0 F3.1");

  // G = 4 > P = 2: stage 0 receives the wrap-around activations G - P = 2 forwards early, in
  // the batch where stage 1 sends them, so blocking sends do not deadlock.
  s = BuildForwardOnlySchedule(Opts(ScheduleKind::kInterleaved, 2, 2, 8, 4));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Names(s->stages[0]),
            "F0.0 SA0.0>1 F1.0 SA1.0>1 RA0.1<1 F2.0 SA2.0>1 RA1.1<1 F3.0 SA3.0>1 RA2.1<1 "
            "F0.1 SA0.1>1 RA3.1<1 F1.1 SA1.1>1 F2.1 SA2.1>1 F3.1 SA3.1>1 "
            "F4.0 SA4.0>1 F5.0 SA5.0>1 RA4.1<1 F6.0 SA6.0>1 RA5.1<1 F7.0 SA7.0>1 RA6.1<1 "
            "F4.1 SA4.1>1 RA7.1<1 F5.1 SA5.1>1 F6.1 SA6.1>1 F7.1 SA7.1>1");
}

TEST(ForwardOnlyScheduleTest, SingleStageHasNoCommunication) {
  absl::StatusOr<Schedule> s = BuildForwardOnlySchedule(Opts(ScheduleKind::k1F1B, 1, 1, 3));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Names(s->stages[0]), "F0.0 F1.0 F2.0");
}

}  // namespace
}  // namespace loom::pipeline

namespace loom::pipeline {
namespace {

std::vector<ScheduleOptions> ZeroBubbleGrid() {
  std::vector<ScheduleOptions> out;
  for (int pp = 1; pp <= 5; ++pp) {
    for (int m = 1; m <= 12; ++m) {
      out.push_back(Opts(ScheduleKind::kZBH1, pp, 1, m));
      out.push_back(Opts(ScheduleKind::kZBV, pp, 2, m));
    }
  }
  return out;
}

TEST(ZeroBubbleScheduleTest, ParseAndNames) {
  EXPECT_EQ(*ParseScheduleKind("zb-h1"), ScheduleKind::kZBH1);
  EXPECT_EQ(*ParseScheduleKind("ZBH1"), ScheduleKind::kZBH1);
  EXPECT_EQ(*ParseScheduleKind("zbv"), ScheduleKind::kZBV);
  EXPECT_EQ(*ParseScheduleKind("ZBVZeroBubble"), ScheduleKind::kZBV);
  for (ScheduleKind k : {ScheduleKind::kZBH1, ScheduleKind::kZBV}) {
    EXPECT_EQ(*ParseScheduleKind(ScheduleKindName(k)), k);
    EXPECT_TRUE(SplitsBackward(k));
  }
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved}) {
    EXPECT_FALSE(SplitsBackward(k));
  }
  EXPECT_TRUE(Mentions(ParseScheduleKind("zb-h2").status(), "zb-h1 | zbv"));
}

TEST(ZeroBubbleScheduleTest, OptionErrorsNameTheFlags) {
  absl::Status s = ValidateScheduleOptions(Opts(ScheduleKind::kZBV, 4, 1, 8));
  EXPECT_TRUE(Mentions(s, "--pipeline-schedule=zbv")) << s;
  EXPECT_TRUE(Mentions(s, "--virtual-pipeline-model-parallel-size (--vpp) = 2")) << s;
  s = ValidateScheduleOptions(Opts(ScheduleKind::kZBV, 4, 3, 8));
  EXPECT_TRUE(Mentions(s, "got 3")) << s;
  s = ValidateScheduleOptions(Opts(ScheduleKind::kZBV, 4, 2, 8, 4));
  EXPECT_TRUE(Mentions(s, "--microbatch-group-size-per-virtual-pipeline-stage")) << s;
  s = ValidateScheduleOptions(Opts(ScheduleKind::kZBH1, 4, 2, 8));
  EXPECT_TRUE(Mentions(s, "--pipeline-schedule=zb-h1 runs one chunk per stage")) << s;
  s = ValidateScheduleOptions(Opts(ScheduleKind::kZBH1, 4, 1, 8, 4));
  EXPECT_TRUE(Mentions(s, "--microbatch-group-size-per-virtual-pipeline-stage")) << s;
  s = ValidateScheduleOptions(Opts(ScheduleKind::kZBH1, 4, 1, 0));
  EXPECT_TRUE(Mentions(s, "--micro-batches")) << s;
  EXPECT_TRUE(ValidateScheduleOptions(Opts(ScheduleKind::kZBV, 4, 2, 1)).ok());
  EXPECT_TRUE(ValidateScheduleOptions(Opts(ScheduleKind::kZBH1, 1, 1, 1)).ok());
}

TEST(ZeroBubbleScheduleTest, VShapePlacement) {
  const ScheduleOptions v = Opts(ScheduleKind::kZBV, 4, 2, 8);
  EXPECT_EQ(VirtualStageOf(v, 0, 0), 0);
  EXPECT_EQ(VirtualStageOf(v, 0, 1), 7);
  EXPECT_EQ(VirtualStageOf(v, 3, 0), 3);
  EXPECT_EQ(VirtualStageOf(v, 3, 1), 4);
  const ScheduleOptions i = Opts(ScheduleKind::kInterleaved, 4, 2, 8);
  EXPECT_EQ(VirtualStageOf(i, 0, 1), 4);
  EXPECT_EQ(VirtualStageOf(i, 3, 1), 7);
  for (const ScheduleOptions& o : {v, i, Opts(ScheduleKind::kZBV, 1, 2, 2)}) {
    std::vector<int> seen(o.pp * o.vp, 0);
    for (int r = 0; r < o.pp; ++r) {
      for (int c = 0; c < o.vp; ++c) {
        const int vs = VirtualStageOf(o, r, c);
        ASSERT_GE(vs, 0);
        ASSERT_LT(vs, o.pp * o.vp);
        seen[vs]++;
        EXPECT_EQ(PlacementOf(o, vs).pp_rank, r);
        EXPECT_EQ(PlacementOf(o, vs).chunk, c);
      }
    }
    for (int n : seen) EXPECT_EQ(n, 1);
  }
}

TEST(ZeroBubbleScheduleTest, EveryForwardInputAndWeightGradOncePerStageWAfterItsI) {
  for (const ScheduleOptions& o : ZeroBubbleGrid()) {
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int r = 0; r < o.pp; ++r) {
      std::map<std::pair<int, int>, int> f, i, w;
      for (const Action& a : s->stages[r]) {
        const std::pair<int, int> key{a.micro_batch, a.chunk};
        EXPECT_NE(a.kind, ActionKind::kBackward);
        if (a.kind == ActionKind::kForward) {
          EXPECT_EQ(i[key], 0);
          f[key]++;
        }
        if (a.kind == ActionKind::kBackwardInput) {
          EXPECT_EQ(f[key], 1) << ToString(a);
          i[key]++;
        }
        if (a.kind == ActionKind::kBackwardWeight) {
          EXPECT_EQ(i[key], 1) << ToString(a) << " P=" << o.pp << " M=" << o.micro_batches;
          w[key]++;
        }
      }
      ASSERT_EQ(static_cast<int>(w.size()), o.micro_batches * o.vp);
      for (const auto& [key, n] : f) EXPECT_EQ(n, 1);
      for (const auto& [key, n] : i) EXPECT_EQ(n, 1);
      for (const auto& [key, n] : w) EXPECT_EQ(n, 1);
    }
  }
}

TEST(ZeroBubbleScheduleTest, CommunicationCounts) {
  for (const ScheduleOptions& o : ZeroBubbleGrid()) {
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    ASSERT_TRUE(s.ok());
    // Boundaries between virtual stages on different stages: zb-h1 P − 1; zbv 2P − 1 less the
    // local turn of the V on stage P − 1.
    const int boundaries = o.kind == ScheduleKind::kZBV ? 2 * o.pp - 2 : o.pp - 1;
    std::map<ActionKind, int> counts;
    for (int r = 0; r < o.pp; ++r) {
      for (const Action& a : s->stages[r]) counts[a.kind]++;
    }
    for (ActionKind k : {ActionKind::kSendActivation, ActionKind::kRecvActivation,
                         ActionKind::kSendGrad, ActionKind::kRecvGrad}) {
      EXPECT_EQ(counts[k], boundaries * o.micro_batches);
    }
  }
}

// Stage 1 of P = 4: 1F1B's two warm-up forwards, then W(m) after I(m + 1); written out by hand.
TEST(ZeroBubbleScheduleTest, ZBH1StageOneGolden) {
  std::vector<std::string> names;
  for (const Action& a : ComputeOrder(Opts(ScheduleKind::kZBH1, 4, 1, 8), 1)) {
    names.push_back(ToShortString(a));
  }
  EXPECT_EQ(absl::StrJoin(names, " "),
            "F0.0 F1.0 F2.0 I0.0 F3.0 I1.0 W0.0 F4.0 I2.0 W1.0 F5.0 I3.0 W2.0 F6.0 I4.0 W3.0 "
            "F7.0 I5.0 W4.0 I6.0 W5.0 I7.0 W6.0 W7.0");
  names.clear();
  for (const Action& a : ComputeOrder(Opts(ScheduleKind::kZBH1, 4, 1, 8), 3)) {
    names.push_back(ToShortString(a));
  }
  EXPECT_EQ(names[0] + " " + names[1] + " " + names[2] + " " + names[3], "F0.0 I0.0 F1.0 I1.0");
}

// torch's ScheduleZBVZeroBubble order for P = 2, M = 4, written out from its loops by hand:
// stage 0: warm-up 3 F of chunk 0, no pairs, 2 x (F I W of chunk 1), steady, cool-down;
// stage 1: 1 F of chunk 0, 1 pair, 1 x (F I W of chunk 1), steady, cool-down (I I, I W, W W).
TEST(ZeroBubbleScheduleTest, ZBVGolden) {
  std::vector<std::string> names;
  for (const Action& a : ComputeOrder(Opts(ScheduleKind::kZBV, 2, 2, 4), 0)) {
    names.push_back(ToShortString(a));
  }
  EXPECT_EQ(absl::StrJoin(names, " "),
            "F0.0 F1.0 F2.0 F0.1 I0.1 W0.1 F1.1 I1.1 W1.1 "
            "F3.0 I0.0 W0.0 F2.1 I2.1 W2.1 I1.0 W1.0 F3.1 I3.1 W3.1 "
            "I2.0 W2.0 I3.0 W3.0");
  names.clear();
  for (const Action& a : ComputeOrder(Opts(ScheduleKind::kZBV, 2, 2, 4), 1)) {
    names.push_back(ToShortString(a));
  }
  EXPECT_EQ(absl::StrJoin(names, " "),
            "F0.0 F0.1 F1.0 F1.1 I0.1 W0.1 F2.0 I0.0 W0.0 F2.1 I1.1 W1.1 "
            "F3.0 I1.0 W1.0 F3.1 I2.1 W2.1 I2.0 I3.1 I3.0 W2.0 W3.1 W3.0");
}

TEST(ZeroBubbleScheduleTest, WarmupAndPeakActivations) {
  for (int pp : {2, 4, 8}) {
    for (int m : {1, 2, pp, 2 * pp - 1, 16, 32}) {
      for (int r = 0; r < pp; ++r) {
        const ScheduleOptions h1 = Opts(ScheduleKind::kZBH1, pp, 1, m);
        const ScheduleOptions one = Opts(ScheduleKind::k1F1B, pp, 1, m);
        EXPECT_EQ(WarmupForwards(h1, r), WarmupForwards(one, r));
        // 1F1B's own peak on stage r, and ZB-H1's: stage 0's 1F1B peak on every stage.
        EXPECT_EQ(PeakInFlightActivations(one, r), std::min(WarmupForwards(one, r) + 1, m));
        EXPECT_EQ(PeakInFlightActivations(h1, r), PeakInFlightActivations(one, 0));
        const ScheduleOptions v = Opts(ScheduleKind::kZBV, pp, 2, m);
        if (m >= 2 * pp - 1) {
          EXPECT_EQ(WarmupForwards(v, r), 2 * pp - 1) << "P=" << pp << " M=" << m << " r=" << r;
          // 2P chunk activations of half a stage each: 1F1B's stage-0 peak of P stages' worth.
          EXPECT_EQ(PeakInFlightActivations(v, r), 2 * PeakInFlightActivations(one, 0));
        }
        EXPECT_LE(PeakInFlightActivations(v, r), 2 * pp);
      }
    }
  }
  EXPECT_EQ(PeakInFlightActivations(Opts(ScheduleKind::kGPipe, 4, 1, 8), 3), 8);
}

TEST(ZeroBubbleScheduleTest, ForwardOnly) {
  absl::StatusOr<Schedule> h1 = BuildForwardOnlySchedule(Opts(ScheduleKind::kZBH1, 3, 1, 4));
  absl::StatusOr<Schedule> one = BuildForwardOnlySchedule(Opts(ScheduleKind::k1F1B, 3, 1, 4));
  ASSERT_TRUE(h1.ok() && one.ok());
  EXPECT_EQ(h1->stages, one->stages);
}

// The V's forward-only lists: each stage runs chunk 0's forwards then chunk 1's, in micro-batch
// order, a receive right before each forward that needs one and its send right after, and the
// sends and receives of every link pair up in order.
TEST(ZeroBubbleScheduleTest, ForwardOnlyV) {
  for (ScheduleKind kind : {ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int m = kind == ScheduleKind::kZBV ? 1 : 2 * pp; m <= 12; ++m) {
        const ScheduleOptions o = Opts(kind, pp, 2, m);
        absl::StatusOr<Schedule> s = BuildForwardOnlySchedule(o);
        ASSERT_TRUE(s.ok()) << s.status();
        std::map<std::pair<int, int>, std::vector<Action>> sent, received;  // (src, dst)
        for (int r = 0; r < pp; ++r) {
          std::vector<std::string> forwards, want;
          for (int c = 0; c < 2; ++c) {
            for (int k = 0; k < m; ++k) want.push_back(ToShortString(Forward(k, c)));
          }
          const std::vector<Action>& list = s->stages[r];
          for (size_t i = 0; i < list.size(); ++i) {
            const Action& a = list[i];
            EXPECT_FALSE(IsBackward(a.kind));
            if (a.kind == ActionKind::kForward) forwards.push_back(ToShortString(a));
            if (a.kind == ActionKind::kRecvActivation) {
              ASSERT_LT(i + 1, list.size());
              EXPECT_EQ(list[i + 1], Forward(a.micro_batch, a.chunk));
              received[{a.peer, r}].push_back(a);
            }
            if (a.kind == ActionKind::kSendActivation) {
              ASSERT_GT(i, 0u);
              EXPECT_EQ(list[i - 1], Forward(a.micro_batch, a.chunk));
              sent[{r, a.peer}].push_back(a);
            }
          }
          EXPECT_EQ(forwards, want) << ScheduleKindName(kind) << " P=" << pp << " r=" << r;
        }
        // 2P − 2 links cross stages (the V turns locally on stage P − 1), M tensors each.
        int tensors = 0;
        for (const auto& [link, sends] : sent) {
          const std::vector<Action>& recvs = received[link];
          ASSERT_EQ(sends.size(), recvs.size());
          for (size_t k = 0; k < sends.size(); ++k) {
            EXPECT_EQ(sends[k].micro_batch, recvs[k].micro_batch);
            const int dst_vs = VirtualStageOf(o, link.first, sends[k].chunk) + 1;
            EXPECT_EQ(VirtualStageOf(o, link.second, recvs[k].chunk), dst_vs);
          }
          tensors += static_cast<int>(sends.size());
        }
        EXPECT_EQ(tensors, (2 * pp - 2) * m);
      }
    }
  }
}

// ---- DualPipeV (#39)

// torch's own order (tools/pytorch_reference/dualpipev_order.py ran torch's
// ScheduleDualPipeV._calculate_single_rank_operations): every stage of nine (P, M) pairs,
// action for action; in BuildSchedule's list an F&B pair's forward is followed by its own sends
// (out before the backward runs) and the backward's receives, then the backward.
TEST(DualPipeVScheduleTest, EqualsTorchsOrder) {
  std::ifstream in("pipeline/testdata/dualpipev_torch_order.txt");
  ASSERT_TRUE(in) << "pipeline/testdata/dualpipev_torch_order.txt";
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int p = 0, m = 0, r = 0;
    char colon = 0;
    fields >> p >> m >> r >> colon;
    std::vector<std::string> torch_steps;
    for (std::string t; fields >> t;) torch_steps.push_back(t);
    const ScheduleOptions o = Opts(ScheduleKind::kDualPipeV, p, 2, m);
    std::vector<std::string> flat;
    for (const Action& a : ComputeOrder(o, r)) flat.push_back(ToShortString(a));
    std::string torch_flat = absl::StrJoin(torch_steps, " ");
    std::replace(torch_flat.begin(), torch_flat.end(), '+', ' ');
    EXPECT_EQ(absl::StrJoin(flat, " "), torch_flat) << "P=" << p << " M=" << m << " r=" << r;
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::vector<Action>& list = s->stages[r];
    for (const std::string& t : torch_steps) {
      const size_t plus = t.find('+');
      if (plus == std::string::npos) continue;
      auto f = std::find_if(list.begin(), list.end(),
                            [&](const Action& a) { return ToShortString(a) == t.substr(0, plus); });
      ASSERT_NE(f, list.end()) << t;
      auto next = std::find_if(f + 1, list.end(), [](const Action& a) { return IsCompute(a.kind); });
      ASSERT_NE(next, list.end()) << t;
      EXPECT_EQ(ToShortString(*next), t.substr(plus + 1)) << t << "; P=" << p << " M=" << m;
      for (auto a = f + 1; a != next; ++a) {
        const bool own_send = IsSend(a->kind) && a->micro_batch == f->micro_batch &&
                              a->chunk == f->chunk;
        const bool backward_recv = a->kind == ActionKind::kRecvGrad &&
                                   a->micro_batch == next->micro_batch && a->chunk == next->chunk;
        EXPECT_TRUE(own_send || backward_recv) << ToString(*a) << " inside " << t;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 33);
}

TEST(DualPipeVScheduleTest, EveryChunkOnceEitherFullOrSplitAndOptionErrors) {
  for (int pp = 1; pp <= 5; ++pp) {
    for (int m = 2 * pp; m <= 14; ++m) {
      const ScheduleOptions o = Opts(ScheduleKind::kDualPipeV, pp, 2, m);
      absl::StatusOr<Schedule> s = BuildSchedule(o);
      ASSERT_TRUE(s.ok()) << s.status();
      for (int r = 0; r < pp; ++r) {
        std::map<std::pair<int, int>, std::string> done;  // (m, c) -> "F", "FB", "FI", "FIW"
        for (const Action& a : s->stages[r]) {
          if (!IsCompute(a.kind)) continue;
          std::string& d = done[{a.micro_batch, a.chunk}];
          const std::string before = d;
          d += ToShortString(a).substr(0, 1);
          EXPECT_TRUE(d == "F" || d == "FB" || d == "FI" || d == "FIW")
              << ToString(a) << " after '" << before << "', P=" << pp << " M=" << m;
        }
        ASSERT_EQ(static_cast<int>(done.size()), 2 * m);
        for (const auto& [key, d] : done) EXPECT_TRUE(d == "FB" || d == "FIW") << d;
      }
      // zbv's boundaries: 2P − 1 less the local turn of the V on stage P − 1.
      std::map<ActionKind, int> counts;
      for (int r = 0; r < pp; ++r) {
        for (const Action& a : s->stages[r]) counts[a.kind]++;
      }
      EXPECT_EQ(counts[ActionKind::kSendActivation], (2 * pp - 2) * m);
      EXPECT_EQ(counts[ActionKind::kRecvGrad], (2 * pp - 2) * m);
    }
  }
  EXPECT_TRUE(SplitsBackward(ScheduleKind::kDualPipeV));
  EXPECT_TRUE(IsVShape(ScheduleKind::kDualPipeV));
  EXPECT_FALSE(IsVShape(ScheduleKind::kInterleaved));
  EXPECT_EQ(*ParseScheduleKind("DualPipeV"), ScheduleKind::kDualPipeV);
  EXPECT_EQ(VirtualStageOf(Opts(ScheduleKind::kDualPipeV, 4, 2, 8), 0, 1), 7);
  absl::Status st = ValidateScheduleOptions(Opts(ScheduleKind::kDualPipeV, 4, 2, 7));
  EXPECT_TRUE(Mentions(st, "--pipeline-schedule=dualpipev needs at least")) << st;
  EXPECT_TRUE(Mentions(st, "= 8; --micro-batches = 7")) << st;
  st = ValidateScheduleOptions(Opts(ScheduleKind::kDualPipeV, 4, 1, 8));
  EXPECT_TRUE(Mentions(st, "--pipeline-schedule=dualpipev runs two chunks per stage")) << st;
}

// DualPipe's table (deepseek-ai/DualPipe README): PP + 1 activations for PP virtual stages,
// here 2P + 1 chunk activations on stage 0, and the 2P − 1 warm-up forwards before the first
// backward of any kind on the stages that start with torch's I1 W1 F1 phase.
TEST(DualPipeVScheduleTest, WarmupAndPeakActivations) {
  for (int pp : {2, 4, 8}) {
    for (int m : {2 * pp, 2 * pp + 3, 32}) {
      const ScheduleOptions o = Opts(ScheduleKind::kDualPipeV, pp, 2, m);
      EXPECT_EQ(PeakInFlightActivations(o, 0), 2 * pp + 1) << "P=" << pp << " M=" << m;
      for (int r = 0; r < pp; ++r) {
        EXPECT_LE(PeakInFlightActivations(o, r), 2 * pp + 1);
        EXPECT_EQ(WarmupForwards(o, r), r < pp - 1 ? 2 * pp - 1 : 2 * pp) << "r=" << r;
      }
    }
  }
}

}  // namespace
}  // namespace loom::pipeline
