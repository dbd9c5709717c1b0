#include "pipeline/simulator.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

Schedule Build(const ScheduleOptions& o) {
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

SimOptions Costs(double f, double b, CommMode mode = CommMode::kEager) {
  SimOptions s;
  s.forward_cost = f;
  s.backward_cost = b;
  s.comm_mode = mode;
  return s;
}

bool Mentions(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

size_t Find(const std::vector<Action>& list, const Action& a) {
  return std::find(list.begin(), list.end(), a) - list.begin();
}

const std::vector<std::pair<double, double>> kCosts = {{1, 1}, {1, 2}, {2, 3}};

TEST(SimulatorTest, GPipeAnd1F1BBubbleIsPMinusOneOverM) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int pp : {2, 4}) {
      for (int m : {4, 8, 16}) {
        for (auto [f, b] : kCosts) {
          for (CommMode mode : {CommMode::kEager, CommMode::kRendezvous}) {
            absl::StatusOr<SimResult> r = Simulate(Build(Opts(kind, pp, 1, m)), Costs(f, b, mode));
            ASSERT_TRUE(r.ok()) << r.status();
            EXPECT_NEAR(r->bubble_fraction, double(pp - 1) / m, 1e-12)
                << ScheduleKindName(kind) << " P=" << pp << " M=" << m << " f=" << f << " b=" << b;
            EXPECT_DOUBLE_EQ(r->ideal, m * (f + b));
            EXPECT_DOUBLE_EQ(r->makespan, (m + pp - 1) * (f + b));
          }
        }
      }
    }
  }
}

TEST(SimulatorTest, InterleavedBubbleIsPMinusOneOverVM) {
  for (int pp : {2, 4}) {
    for (int m : {4, 8, 16}) {
      for (int vp : {2, 3, 4}) {
        for (auto [f, b] : kCosts) {
          for (CommMode mode : {CommMode::kEager, CommMode::kRendezvous}) {
            absl::StatusOr<SimResult> r =
                Simulate(Build(Opts(ScheduleKind::kInterleaved, pp, vp, m)), Costs(f, b, mode));
            ASSERT_TRUE(r.ok()) << r.status();
            EXPECT_NEAR(r->bubble_fraction, double(pp - 1) / (vp * m), 1e-12)
                << "P=" << pp << " v=" << vp << " M=" << m << " f=" << f << " b=" << b;
            EXPECT_DOUBLE_EQ(r->ideal, m * vp * (f + b));
          }
        }
      }
    }
  }
}

TEST(SimulatorTest, PeakActivations) {
  for (int pp : {1, 2, 3, 4, 6}) {
    for (int m : {1, 2, 4, 8, 16}) {
      absl::StatusOr<SimResult> gpipe = Simulate(Build(Opts(ScheduleKind::kGPipe, pp, 1, m)));
      absl::StatusOr<SimResult> ofob = Simulate(Build(Opts(ScheduleKind::k1F1B, pp, 1, m)));
      ASSERT_TRUE(gpipe.ok() && ofob.ok());
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(gpipe->stages[r].peak_activations, m);
        EXPECT_LE(ofob->stages[r].peak_activations, pp);
        EXPECT_EQ(ofob->stages[r].peak_activations, std::min(pp - r, m))
            << "P=" << pp << " M=" << m << " stage " << r;
      }
    }
  }
}

TEST(SimulatorTest, ExactTimingsOfASmall1F1B) {
  // P=2, M=2, f=1, b=2. Stage 0: F0 [0,1) F1 [1,2); stage 1: F0 [1,2) B0 [2,4) F1 [4,5)
  // B1 [5,7); stage 0: B0 [4,6) B1 [7,9).
  absl::StatusOr<SimResult> r = Simulate(Build(Opts(ScheduleKind::k1F1B, 2, 1, 2)), Costs(1, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  auto span = [&](int stage, const Action& a) {
    for (const TimedAction& t : r->stages[stage].actions) {
      if (t.action == a) return std::make_pair(t.start, t.end);
    }
    return std::make_pair(-1.0, -1.0);
  };
  EXPECT_EQ(span(0, Forward(1, 0)), std::make_pair(1.0, 2.0));
  EXPECT_EQ(span(1, Backward(0, 0)), std::make_pair(2.0, 4.0));
  EXPECT_EQ(span(1, Forward(1, 0)), std::make_pair(4.0, 5.0));
  EXPECT_EQ(span(0, Backward(0, 0)), std::make_pair(4.0, 6.0));
  EXPECT_EQ(span(0, Backward(1, 0)), std::make_pair(7.0, 9.0));
  EXPECT_DOUBLE_EQ(r->makespan, 9.0);
  EXPECT_DOUBLE_EQ(r->stages[1].finish, 7.0);
}

TEST(SimulatorTest, CommCostAndPerActionCost) {
  SimOptions sim = Costs(1, 2);
  sim.comm_cost = 0.5;
  // P=2, M=1: F F B B in a chain with two transfers.
  absl::StatusOr<SimResult> r = Simulate(Build(Opts(ScheduleKind::k1F1B, 2, 1, 1)), sim);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2);

  SimOptions custom;
  custom.cost = [](int stage, const Action& a) {
    if (!IsCompute(a.kind)) return 0.0;
    return stage == 1 ? 3.0 : 1.0;  // a slow last stage
  };
  r = Simulate(Build(Opts(ScheduleKind::kGPipe, 2, 1, 2)), custom);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->ideal, 12.0);  // stage 1: 4 actions x 3
  EXPECT_DOUBLE_EQ(r->stages[0].busy, 4.0);
  EXPECT_DOUBLE_EQ(r->makespan, 1 + 12 + 1);
}

TEST(SimulatorTest, NoDeadlockOverAGrid) {
  int checked = 0;
  for (int pp = 1; pp <= 6; ++pp) {
    for (int m = 1; m <= 12; ++m) {
      std::vector<ScheduleOptions> all = {Opts(ScheduleKind::kGPipe, pp, 1, m),
                                          Opts(ScheduleKind::k1F1B, pp, 1, m)};
      for (int vp = 2; vp <= 4 && pp >= 2; ++vp) {
        for (int g = pp; g <= m; ++g) {
          if (m % g == 0) all.push_back(Opts(ScheduleKind::kInterleaved, pp, vp, m, g));
        }
      }
      for (const ScheduleOptions& o : all) {
        const Schedule s = Build(o);
        for (double comm : {0.0, 0.3}) {
          SimOptions sim = Costs(1, 2);
          sim.comm_cost = comm;
          absl::StatusOr<SimResult> r = Simulate(s, sim);
          EXPECT_TRUE(r.ok()) << ScheduleKindName(o.kind) << " P=" << pp << " v=" << o.vp
                              << " M=" << m << " G=" << o.microbatch_group_size << ": "
                              << r.status();
          ++checked;
          // Blocking sends work too whenever G = P (every schedule Megatron runs by default).
          if (EffectiveGroupSize(o) <= o.pp) {
            sim.comm_mode = CommMode::kRendezvous;
            r = Simulate(s, sim);
            EXPECT_TRUE(r.ok()) << "rendezvous " << ScheduleKindName(o.kind) << " P=" << pp
                                << " v=" << o.vp << " M=" << m << ": " << r.status();
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(SimulatorTest, ReceiveBeforeItsSendIsADeadlock) {
  // 1F1B, P=2: stage 0 waits for the grad of micro-batch 0 before it has sent the activation
  // of micro-batch 0, while stage 1 waits for that activation.
  Schedule s = Build(Opts(ScheduleKind::k1F1B, 2, 1, 4));
  std::vector<Action>& st0 = s.stages[0];
  const size_t send = Find(st0, {ActionKind::kSendActivation, 0, 0, 1});
  const size_t recv = Find(st0, {ActionKind::kRecvGrad, 0, 0, 1});
  ASSERT_LT(send, recv);
  ASSERT_LT(recv, st0.size());
  std::swap(st0[send], st0[recv]);
  for (CommMode mode : {CommMode::kEager, CommMode::kRendezvous}) {
    absl::StatusOr<SimResult> r = Simulate(s, Costs(1, 2, mode));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_TRUE(Mentions(r.status(), "deadlock")) << r.status();
    EXPECT_TRUE(Mentions(r.status(), "stage 0 is blocked")) << r.status();
    EXPECT_TRUE(Mentions(r.status(), "RecvGrad(micro-batch 0, chunk 0) from stage 1"))
        << r.status();
    EXPECT_TRUE(Mentions(r.status(), "stage 1 is blocked")) << r.status();
    EXPECT_TRUE(Mentions(r.status(), "RecvActivation(micro-batch 0, chunk 0) from stage 0"))
        << r.status();
  }
}

TEST(SimulatorTest, ComputeBeforeItsInputCannotProgress) {
  Schedule s = Build(Opts(ScheduleKind::kGPipe, 3, 1, 2));
  std::vector<Action>& st1 = s.stages[1];
  const size_t recv = Find(st1, {ActionKind::kRecvActivation, 0, 0, 0});
  const size_t fwd = Find(st1, Forward(0, 0));
  ASSERT_EQ(recv + 1, fwd);
  std::swap(st1[recv], st1[fwd]);
  absl::StatusOr<SimResult> r = Simulate(s);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(r.status(), "stage 1 cannot make progress")) << r.status();
  EXPECT_TRUE(Mentions(r.status(), "activation of micro-batch 0")) << r.status();
}

TEST(SimulatorTest, BackwardBeforeForwardAndSendBeforeCompute) {
  Schedule s = Build(Opts(ScheduleKind::k1F1B, 1, 1, 2));
  std::swap(s.stages[0][0], s.stages[0][1]);  // B0 before F0
  absl::StatusOr<SimResult> r = Simulate(s);
  EXPECT_TRUE(Mentions(r.status(), "its own Forward(micro-batch 0, chunk 0)")) << r.status();

  Schedule t = Build(Opts(ScheduleKind::kGPipe, 2, 1, 1));
  std::swap(t.stages[0][0], t.stages[0][1]);  // SendActivation before Forward
  r = Simulate(t);
  EXPECT_TRUE(Mentions(r.status(), "has not run before it")) << r.status();
}

// Replaces every Backward(m, c) by BackwardInput(m, c) and, right after it or (defer) at the end
// of the stage's list, BackwardWeight(m, c).
Schedule SplitBackwards(Schedule s, bool defer) {
  for (std::vector<Action>& list : s.stages) {
    std::vector<Action> out, tail;
    for (const Action& a : list) {
      if (a.kind != ActionKind::kBackward) {
        out.push_back(a);
        continue;
      }
      out.push_back(BackwardInput(a.micro_batch, a.chunk));
      (defer ? tail : out).push_back(BackwardWeight(a.micro_batch, a.chunk));
    }
    out.insert(out.end(), tail.begin(), tail.end());
    list = out;
  }
  return s;
}

TEST(SimulatorTest, SplitBackwardRightAfterItsInputHalfTimesLikeAFullBackward) {
  for (auto [bi, bw] : std::vector<std::pair<double, double>>{{1, 1}, {0.5, 1.5}, {2, 0.25}}) {
    const Schedule full = Build(Opts(ScheduleKind::k1F1B, 4, 1, 8));
    SimOptions whole = Costs(1, bi + bw);
    SimOptions split = whole;
    split.backward_input_cost = bi;
    split.backward_weight_cost = bw;
    absl::StatusOr<SimResult> a = Simulate(full, whole);
    absl::StatusOr<SimResult> b = Simulate(SplitBackwards(full, false), split);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_DOUBLE_EQ(a->makespan, b->makespan);
    EXPECT_DOUBLE_EQ(a->ideal, b->ideal);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(a->stages[r].peak_activations, b->stages[r].peak_activations);
    }
  }
}

TEST(SimulatorTest, DeferredWeightGradsHoldActivationsButNotTheUpstreamStage) {
  const Schedule s = SplitBackwards(Build(Opts(ScheduleKind::kGPipe, 2, 1, 3)), true);
  absl::StatusOr<SimResult> r = Simulate(s);
  ASSERT_TRUE(r.ok()) << r.status();
  // All W deferred: nothing is freed before the last BackwardInput on either stage.
  EXPECT_EQ(r->stages[0].peak_activations, 3);
  EXPECT_EQ(r->stages[1].peak_activations, 3);
  // Stage 0's BackwardInput(2) starts when stage 1's BackwardInput(2) ends (comm is free), not
  // after stage 1's weight grads.
  double upstream_end = -1, downstream_start = -1, last_w_end = -1;
  for (const TimedAction& t : r->stages[1].actions) {
    if (t.action == BackwardInput(2, 0)) upstream_end = t.end;
    if (t.action.kind == ActionKind::kBackwardWeight) last_w_end = std::max(last_w_end, t.end);
  }
  for (const TimedAction& t : r->stages[0].actions) {
    if (t.action == BackwardInput(2, 0)) downstream_start = t.start;
  }
  EXPECT_GT(upstream_end, 0);
  EXPECT_DOUBLE_EQ(downstream_start, upstream_end);
  EXPECT_LT(downstream_start, last_w_end);
}

TEST(SimulatorTest, SplitBackwardOrderingErrors) {
  const Schedule base = SplitBackwards(Build(Opts(ScheduleKind::k1F1B, 1, 1, 2)), false);
  ASSERT_EQ(base.stages[0][1], BackwardInput(0, 0));
  ASSERT_EQ(base.stages[0][2], BackwardWeight(0, 0));
  Schedule s = base;  // W before its I
  std::swap(s.stages[0][1], s.stages[0][2]);
  absl::StatusOr<SimResult> r = Simulate(s);
  EXPECT_TRUE(Mentions(r.status(), "its own BackwardInput(micro-batch 0, chunk 0)")) << r.status();

  s = base;  // I without W
  s.stages[0].erase(s.stages[0].begin() + 2);
  r = Simulate(s);
  EXPECT_TRUE(Mentions(r.status(), "BackwardWeight) never ran")) << r.status();

  s = base;  // I and a full Backward
  s.stages[0][2] = Backward(0, 0);
  r = Simulate(s);
  EXPECT_TRUE(Mentions(r.status(), "runs twice")) << r.status();

  s = base;  // W twice
  s.stages[0].insert(s.stages[0].begin() + 3, BackwardWeight(0, 0));
  r = Simulate(s);
  EXPECT_TRUE(Mentions(r.status(), "runs twice")) << r.status();
}

TEST(SimulatorTest, ReorderedReceivesAreAMismatch) {
  Schedule s = Build(Opts(ScheduleKind::kGPipe, 2, 1, 4));
  std::vector<Action>& st1 = s.stages[1];
  const size_t a = Find(st1, {ActionKind::kRecvActivation, 0, 0, 0});
  const size_t b = Find(st1, {ActionKind::kRecvActivation, 1, 0, 0});
  std::swap(st1[a], st1[b]);
  absl::StatusOr<SimResult> r = Simulate(s);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Mentions(r.status(), "same order")) << r.status();
}

TEST(SimulatorTest, MissingReceiveIsReported) {
  Schedule s = Build(Opts(ScheduleKind::kGPipe, 2, 1, 2));
  std::vector<Action>& st0 = s.stages[0];
  st0.erase(st0.begin() + Find(st0, {ActionKind::kRecvGrad, 1, 0, 1}));
  absl::StatusOr<SimResult> r = Simulate(s);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Mentions(r.status(), "grad")) << r.status();
}

TEST(SimulatorTest, WrongPeerIsRejected) {
  Schedule s = Build(Opts(ScheduleKind::kGPipe, 3, 1, 1));
  for (Action& a : s.stages[0]) {
    if (a.kind == ActionKind::kSendActivation) a.peer = 2;
  }
  absl::StatusOr<SimResult> r = Simulate(s);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(r.status(), "lives on stage 1, not on stage 2")) << r.status();
}

TEST(SimulatorTest, LargeGroupNeedsBufferedSends) {
  // G > P: stage P-1's warm-up sends wrap to stage 0 long before stage 0 receives them. Fine
  // with buffered sends; with blocking sends the simulator reports the deadlock.
  const Schedule s = Build(Opts(ScheduleKind::kInterleaved, 2, 2, 8, 4));
  EXPECT_TRUE(Simulate(s, Costs(1, 2, CommMode::kEager)).ok());
  absl::StatusOr<SimResult> r = Simulate(s, Costs(1, 2, CommMode::kRendezvous));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(r.status(), "deadlock")) << r.status();
}

TEST(SimulatorTest, UntaggedChannelsMixActivationsAndGradsWhenPIsTwo) {
  // With P = 2 both tensor kinds travel between the same pair; one FIFO per pair (no tags)
  // matches a grad with an activation, which the simulator reports.
  const Schedule s = Build(Opts(ScheduleKind::kInterleaved, 2, 2, 8, 4));
  SimOptions sim;
  sim.tagged_channels = false;
  absl::StatusOr<SimResult> r = Simulate(s, sim);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Mentions(r.status(), "same order")) << r.status();
}

TEST(SimulatorTest, RejectsAScheduleWithTheWrongNumberOfStages) {
  Schedule s = Build(Opts(ScheduleKind::k1F1B, 2, 1, 2));
  s.stages.pop_back();
  EXPECT_EQ(Simulate(s).status().code(), absl::StatusCode::kInvalidArgument);
}

// Forward-only schedules (BuildForwardOnlySchedule).

Schedule BuildForwardOnly(const ScheduleOptions& o) {
  absl::StatusOr<Schedule> s = BuildForwardOnlySchedule(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Simulates a forward-only schedule and checks what does not depend on the simulator's view of
// a missing backward: no deadlock, every send matched by its receive in order, and no Backward
// ran. Today's simulator requires every forward to be followed by its backward and, after
// running every stage to the end and matching every channel, fails with "finished with N
// activation(s) whose Backward never ran" (stage 0 first): that error, with N = M·v, is the
// success of a forward-only schedule here. When the simulator accepts forward-only schedules,
// the timeline is checked instead: no Backward and, with free communication, every stage
// running its k-th forward at (k + r)·f, makespan (M·v + P − 1)·f.
absl::Status SimulateForwardOnly(const Schedule& s, const SimOptions& sim) {
  const ScheduleOptions& o = s.options;
  absl::StatusOr<SimResult> r = Simulate(s, sim);
  if (!r.ok()) return r.status();
  for (int stage = 0; stage < o.pp; ++stage) {
    if (r->stages[stage].peak_activations != 1) {
      return absl::InternalError(absl::StrCat("stage ", stage, " held ",
                                              r->stages[stage].peak_activations, " activations"));
    }
    int forwards = 0;
    for (const TimedAction& t : r->stages[stage].actions) {
      if (t.action.kind == ActionKind::kBackward) {
        return absl::InternalError(absl::StrCat("stage ", stage, " ran ", ToString(t.action)));
      }
      if (t.action.kind != ActionKind::kForward) continue;
      if (sim.comm_cost == 0 && !sim.cost &&
          t.start != (forwards + stage) * sim.forward_cost) {
        return absl::InternalError(absl::StrCat("stage ", stage, " ", ToString(t.action),
                                                " started at ", t.start));
      }
      ++forwards;
    }
    if (forwards != o.micro_batches * o.vp) {
      return absl::InternalError(absl::StrCat("stage ", stage, " ran ", forwards, " forwards"));
    }
  }
  if (sim.comm_cost == 0 && !sim.cost &&
      r->makespan != (o.micro_batches * o.vp + o.pp - 1) * sim.forward_cost) {
    return absl::InternalError(absl::StrCat("makespan ", r->makespan));
  }
  return absl::OkStatus();
}

TEST(SimulatorTest, ForwardOnlyNoDeadlockWithBufferedAndBlockingSends) {
  int checked = 0;
  for (int pp = 1; pp <= 4; ++pp) {
    for (int m = 1; m <= 12; ++m) {
      std::vector<ScheduleOptions> all = {Opts(ScheduleKind::kGPipe, pp, 1, m),
                                          Opts(ScheduleKind::k1F1B, pp, 1, m)};
      for (int vp = 2; vp <= 3 && pp >= 2; ++vp) {
        for (int g = pp; g <= m; ++g) {  // G > P included: no buffering needed
          if (m % g == 0) all.push_back(Opts(ScheduleKind::kInterleaved, pp, vp, m, g));
        }
      }
      for (const ScheduleOptions& o : all) {
        const Schedule s = BuildForwardOnly(o);
        for (CommMode mode : {CommMode::kEager, CommMode::kRendezvous}) {
          for (bool tagged : {true, false}) {  // only activations travel: no tags needed
            for (double comm : {0.0, 0.3}) {
              SimOptions sim = Costs(1.5, 2, mode);
              sim.comm_cost = comm;
              sim.tagged_channels = tagged;
              const absl::Status st = SimulateForwardOnly(s, sim);
              EXPECT_TRUE(st.ok())
                  << (mode == CommMode::kEager ? "eager " : "rendezvous ")
                  << ScheduleKindName(o.kind) << " P=" << pp << " v=" << o.vp << " M=" << m
                  << " G=" << EffectiveGroupSize(o) << " comm=" << comm << " tagged=" << tagged
                  << ": " << st;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

// The V's forward-only lists (zbv, dualpipev): deadlock-free with buffered sends and tagged
// channels, as their training lists; every forward once, none kept.
TEST(SimulatorTest, ForwardOnlyVNoDeadlock) {
  for (ScheduleKind kind : {ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int m = kind == ScheduleKind::kZBV ? 1 : 2 * pp; m <= 12; ++m) {
        SimOptions sim = Costs(1.5, 2);
        sim.comm_cost = 0.3;
        const absl::Status st = SimulateForwardOnly(BuildForwardOnly(Opts(kind, pp, 2, m)), sim);
        EXPECT_TRUE(st.ok()) << ScheduleKindName(kind) << " P=" << pp << " M=" << m << ": " << st;
      }
    }
  }
}

TEST(SimulatorTest, ForwardOnlyRunsNoBackward) {
  // The simulator sees every forward run and none of them followed by a backward.
  for (const ScheduleOptions& o :
       {Opts(ScheduleKind::k1F1B, 4, 1, 3), Opts(ScheduleKind::kGPipe, 2, 1, 5),
        Opts(ScheduleKind::kInterleaved, 4, 3, 8), Opts(ScheduleKind::k1F1B, 1, 1, 2)}) {
    const Schedule s = BuildForwardOnly(o);
    for (const std::vector<Action>& list : s.stages) {
      for (const Action& a : list) {
        EXPECT_NE(a.kind, ActionKind::kBackward);
        EXPECT_NE(a.kind, ActionKind::kSendGrad);
        EXPECT_NE(a.kind, ActionKind::kRecvGrad);
      }
    }
    absl::StatusOr<SimResult> r = Simulate(s);
    if (r.ok()) {  // a simulator that accepts forward-only schedules
      for (const StageTimeline& t : r->stages) {
        EXPECT_DOUBLE_EQ(t.busy, o.micro_batches * o.vp * 1.0);  // forwards only, f = 1
      }
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE(Mentions(r.status(), absl::StrCat("stage 0 finished with ",
                                                    o.micro_batches * o.vp,
                                                    " activation(s) whose Backward never ran")))
          << r.status();
    }
    EXPECT_TRUE(SimulateForwardOnly(s, Costs(1, 2)).ok());
  }
}

TEST(SimulatorTest, ForwardOnlyLargeGroupReceivesEarly) {
  // G > P: stage 1 sends chunk 0's outputs to stage 0 G - P forwards before stage 0 runs them.
  // Stage 0 posts those receives early, in the batch where they are sent; moved to the batch
  // right before their forward (BuildSchedule's placement) they deadlock with blocking sends.
  const Schedule s = BuildForwardOnly(Opts(ScheduleKind::kInterleaved, 2, 2, 8, 4));
  for (CommMode mode : {CommMode::kEager, CommMode::kRendezvous}) {
    EXPECT_TRUE(SimulateForwardOnly(s, Costs(1, 2, mode)).ok());
  }
  Schedule late = s;
  std::vector<Action>& st0 = late.stages[0];
  std::vector<Action> moved;
  for (const Action& a : st0) {
    if (a.kind == ActionKind::kRecvActivation) continue;
    if (a.kind == ActionKind::kForward && a.chunk > 0) {
      moved.push_back({ActionKind::kRecvActivation, a.micro_batch, a.chunk, 1});
    }
    moved.push_back(a);
  }
  st0 = moved;
  EXPECT_TRUE(SimulateForwardOnly(late, Costs(1, 2, CommMode::kEager)).ok());
  const absl::Status st = SimulateForwardOnly(late, Costs(1, 2, CommMode::kRendezvous));
  ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(Mentions(st, "deadlock")) << st;
}

// Zero-bubble schedules (#39). Costs per chunk action: f (Forward), b (BackwardInput, T_B),
// w (BackwardWeight, T_W); a full Backward costs b + w, so every schedule does the same work.
SimOptions SplitCosts(double f, double b, double w, CommMode mode = CommMode::kEager) {
  SimOptions s = Costs(f, b + w, mode);
  s.backward_input_cost = b;
  s.backward_weight_cost = w;
  return s;
}

// zb-h1 is deadlock-free with buffered and with blocking sends; zbv (1F1B's per-action batches
// over torch's order) only with buffered sends, like interleaved with G > P, and with tagged
// channels (activations and grads cross the same link in different orders; the executor tags).
TEST(ZeroBubbleSimulatorTest, NoDeadlockOverAGrid) {
  for (ScheduleKind kind : {ScheduleKind::kZBH1, ScheduleKind::kZBV}) {
    for (int pp = 1; pp <= 6; ++pp) {
      for (int m = 1; m <= 14; ++m) {
        const Schedule s = Build(Opts(kind, pp, kind == ScheduleKind::kZBV ? 2 : 1, m));
        for (CommMode mode : {CommMode::kEager, CommMode::kRendezvous}) {
          if (kind == ScheduleKind::kZBV && mode == CommMode::kRendezvous) continue;
          for (bool tagged : {true, false}) {
            if (kind == ScheduleKind::kZBV && !tagged) continue;
            SimOptions o = SplitCosts(1, 1, 1, mode);
            o.comm_cost = 0.25;
            o.tagged_channels = tagged;
            absl::StatusOr<SimResult> r = Simulate(s, o);
            ASSERT_TRUE(r.ok()) << ScheduleKindName(kind) << " P=" << pp << " M=" << m
                                << (mode == CommMode::kEager ? " eager" : " rendezvous")
                                << (tagged ? " tagged: " : " untagged: ") << r.status();
            for (int st = 0; st < pp; ++st) {
              EXPECT_EQ(r->stages[st].peak_activations,
                        PeakInFlightActivations(s.options, st));
            }
          }
        }
      }
    }
  }
}

// dualpipev as zbv: buffered, tagged channels; M >= 2P as torch requires.
TEST(DualPipeVSimulatorTest, NoDeadlockAndThePeakOfTheSchedule) {
  for (int pp = 1; pp <= 6; ++pp) {
    for (int m = 2 * pp; m <= 14; ++m) {
      const Schedule s = Build(Opts(ScheduleKind::kDualPipeV, pp, 2, m));
      SimOptions o = SplitCosts(1, 1, 1);
      o.comm_cost = 0.25;
      absl::StatusOr<SimResult> r = Simulate(s, o);
      ASSERT_TRUE(r.ok()) << "P=" << pp << " M=" << m << ": " << r.status();
      for (int st = 0; st < pp; ++st) {
        EXPECT_EQ(r->stages[st].peak_activations, PeakInFlightActivations(s.options, st));
      }
    }
  }
}

TEST(ZeroBubbleSimulatorTest, ZBVNeedsBufferedSends) {
  absl::StatusOr<SimResult> r =
      Simulate(Build(Opts(ScheduleKind::kZBV, 2, 2, 2)), SplitCosts(1, 1, 1, CommMode::kRendezvous));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(r.status(), "deadlock")) << r.status();
}

TEST(ZeroBubbleSimulatorTest, PeakActivationsMatchTheScheduleForEveryKind) {
  for (const ScheduleOptions& o :
       {Opts(ScheduleKind::kGPipe, 4, 1, 8), Opts(ScheduleKind::k1F1B, 4, 1, 8),
        Opts(ScheduleKind::k1F1B, 4, 1, 2), Opts(ScheduleKind::kInterleaved, 4, 2, 8),
        Opts(ScheduleKind::kInterleaved, 4, 3, 12, 6)}) {
    absl::StatusOr<SimResult> r = Simulate(Build(o));
    ASSERT_TRUE(r.ok()) << r.status();
    for (int st = 0; st < o.pp; ++st) {
      EXPECT_EQ(r->stages[st].peak_activations, PeakInFlightActivations(o, st));
    }
  }
}

// The bubble table of #39, with zero communication cost and f = b = w (Qi et al.'s assumption
// T_F = T_B = T_W; a full Backward costs b + w = 2f). Bubble fraction = (makespan − ideal) /
// ideal as everywhere here (Megatron's t_bubble / t_ideal); the idle share of the makespan,
// (makespan − ideal) / makespan, is printed too. Formulas, all exact (tolerance 1e-12):
//   1f1b         (p − 1)/m         [Narayanan et al., SC'21, §2.2.1: t_bubble = (p − 1)(t_f + t_b),
//                                   t_ideal = m(t_f + t_b)]; idle share (p − 1)/(m + p − 1)
//   interleaved  (p − 1)/(v·m), v = 2   [same paper, §2.2.2]
//   zb-h1        (p − 1)(T_F + T_B − T_W) / (m(T_F + T_B + T_W)) = (p − 1)/(3m), a third of
//                1F1B's [Qi et al., ICLR 2024, Table 1: ZB-H1's bubble (p − 1)(T_F + T_B − T_W)]
//   zbv          "zero bubble": the paper's ZB-V has no bubble beyond the pipeline's fill, which
//                no schedule avoids: stage p − 1's first input arrives after p − 1 chunk
//                forwards, so makespan >= ideal + (p − 1)·T_F(chunk). We test equality with that
//                lower bound, (p − 1)·T_F / (2m(T_F + T_B + T_W)) = (p − 1)/(6m), for m >= 2p − 1
//                (torch's ScheduleZBVZeroBubble pads to 2p − 1 micro-batches); below that only
//                zbv <= zb-h1.
//   dualpipev    the fill's lower bound as zbv, (p − 1)/(6m), for m >= 2p (torch's
//                requirement): each forward's send leaves before its paired backward runs.
//                (DualPipe's table, (PP/2 − 1)(F&B + B − 3W) with PP = 2p, = (p − 1)/(3m) at
//                F = I = W and F&B = F + B, is what the lists give when a pair's transfers wait
//                for its end, as one batch.)
TEST(ZeroBubbleSimulatorTest, BubbleTableAgainstThePublishedFormulas) {
  std::printf("%-3s %-3s %-12s %10s %10s %10s\n", "p", "m", "schedule", "simulated", "formula",
              "idle/mksp");
  for (int p : {4, 8}) {
    for (int m : {8, 16, 32}) {
      struct Row {
        ScheduleKind kind;
        int vp;
        double formula;  // < 0: no closed form tested
      };
      const bool full_v = m >= 2 * p - 1;
      const Row rows[] = {
          {ScheduleKind::k1F1B, 1, double(p - 1) / m},
          {ScheduleKind::kInterleaved, 2, double(p - 1) / (2.0 * m)},
          {ScheduleKind::kZBH1, 1, double(p - 1) / (3.0 * m)},
          {ScheduleKind::kZBV, 2, full_v ? double(p - 1) / (6.0 * m) : -1},
          {ScheduleKind::kDualPipeV, 2, double(p - 1) / (6.0 * m)},
      };
      double zbh1 = 0;
      for (const Row& row : rows) {
        if (row.kind == ScheduleKind::kDualPipeV && m < 2 * p) continue;  // not a valid layout
        absl::StatusOr<SimResult> r = Simulate(Build(Opts(row.kind, p, row.vp, m)),
                                               SplitCosts(1, 1, 1));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_DOUBLE_EQ(r->ideal, 3.0 * m * row.vp);  // every stage: m·v·(f + b + w)
        const double idle = (r->makespan - r->ideal) / r->makespan;
        std::printf("%-3d %-3d %-12s %10.6f %10.6f %10.6f\n", p, m, ScheduleKindName(row.kind),
                    r->bubble_fraction, row.formula, idle);
        if (row.formula >= 0) {
          EXPECT_NEAR(r->bubble_fraction, row.formula, 1e-12)
              << ScheduleKindName(row.kind) << " p=" << p << " m=" << m;
        }
        if (row.kind == ScheduleKind::k1F1B) {
          EXPECT_NEAR(idle, double(p - 1) / (m + p - 1), 1e-12);
        }
        if (row.kind == ScheduleKind::kZBH1) zbh1 = r->bubble_fraction;
        if (row.kind == ScheduleKind::kZBV) {
          EXPECT_LE(r->bubble_fraction, zbh1 + 1e-12);
        }
      }
    }
  }
}

// ZB-H1's bubble (p − 1)(T_F + T_B − T_W) for other costs with T_W <= T_F, T_B (Qi et al.'s
// setting: W fills the bubble only as far as it is no longer than F and B), and the lower bound
// for zbv.
TEST(ZeroBubbleSimulatorTest, ZBH1BubbleWithUnequalCosts) {
  for (auto [f, b, w] : std::vector<std::tuple<double, double, double>>{
           {1, 1, 0.5}, {1, 1.5, 0.75}, {2, 1, 1}, {1, 2, 1}}) {
    for (int p : {2, 4, 8}) {
      for (int m : {p, 2 * p, 32}) {
        absl::StatusOr<SimResult> r =
            Simulate(Build(Opts(ScheduleKind::kZBH1, p, 1, m)), SplitCosts(f, b, w));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_NEAR(r->makespan - r->ideal, (p - 1) * (f + b - w), 1e-9)
            << "f=" << f << " b=" << b << " w=" << w << " p=" << p << " m=" << m;
        absl::StatusOr<SimResult> v =
            Simulate(Build(Opts(ScheduleKind::kZBV, p, 2, m)), SplitCosts(f, b, w));
        ASSERT_TRUE(v.ok()) << v.status();
        EXPECT_GE(v->makespan - v->ideal, (p - 1) * f - 1e-9);
      }
    }
  }
}

}  // namespace
}  // namespace loom::pipeline
