#include "train/timers.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/testing/ranks_as_threads.h"
#include "gtest/gtest.h"

namespace loom::train {
namespace {

using pipeline::Action;
using pipeline::ActionKind;

// A clock the test moves by hand (ns).
struct FakeClock {
  int64_t now = 1000;
  Timers::Clock fn() {
    return [this] { return now; };
  }
};

TEST(TimersTest, AccumulatesAcrossStartsAndResets) {
  FakeClock clock;
  Timers t(1, clock.fn());
  EXPECT_FALSE(t.Ran(TimerId::kOptimizer));
  t.Start(TimerId::kOptimizer);
  clock.now += 3'000'000;  // 3 ms
  t.Stop(TimerId::kOptimizer);
  t.Start(TimerId::kOptimizer);
  clock.now += 2'000'000;
  t.Stop(TimerId::kOptimizer);
  clock.now += 50'000'000;  // stopped: not counted
  EXPECT_TRUE(t.Ran(TimerId::kOptimizer));
  EXPECT_DOUBLE_EQ(t.Elapsed(TimerId::kOptimizer, /*reset=*/false), 0.005);
  EXPECT_DOUBLE_EQ(t.Elapsed(TimerId::kOptimizer, /*reset=*/true), 0.005);
  EXPECT_DOUBLE_EQ(t.Elapsed(TimerId::kOptimizer, /*reset=*/false), 0.0);
  EXPECT_FALSE(t.Ran(TimerId::kOptimizer));
  // A second Start while running keeps the first start; Stop without Start is ignored.
  t.Start(TimerId::kOptimizer);
  clock.now += 1'000'000;
  t.Start(TimerId::kOptimizer);
  clock.now += 1'000'000;
  t.Stop(TimerId::kOptimizer);
  t.Stop(TimerId::kOptimizer);
  EXPECT_DOUBLE_EQ(t.Elapsed(TimerId::kOptimizer, true), 0.002);
}

TEST(TimersTest, LevelsAreMegatrons) {
  EXPECT_EQ(TimerLevel(TimerId::kSaveCheckpoint), 0);
  EXPECT_EQ(TimerLevel(TimerId::kForwardBackward), 1);
  EXPECT_EQ(TimerLevel(TimerId::kOptimizer), 1);
  EXPECT_EQ(TimerLevel(TimerId::kForwardCompute), 2);
  EXPECT_EQ(TimerLevel(TimerId::kForwardRecv), 2);
  EXPECT_STREQ(TimerName(TimerId::kForwardBackward), "forward-backward");
  EXPECT_STREQ(TimerName(TimerId::kForwardSendBackwardRecv), "forward-send-backward-recv");

  FakeClock clock;
  Timers t(1, clock.fn());
  t.Start(TimerId::kForwardCompute);  // level 2 > 1: off
  clock.now += 1'000'000;
  t.Stop(TimerId::kForwardCompute);
  EXPECT_FALSE(t.Ran(TimerId::kForwardCompute));
  EXPECT_EQ(t.Elapsed(TimerId::kForwardCompute, true), 0.0);

  EXPECT_TRUE(Timers(0).IntervalTimers().empty());  // save-checkpoint is logged after saves
  std::vector<std::string> level1;
  for (TimerId id : Timers(1).IntervalTimers()) level1.push_back(TimerName(id));
  EXPECT_EQ(level1, (std::vector<std::string>{"forward-backward", "optimizer", "grads-all-reduce",
                                              "grads-reduce-scatter", "params-all-gather"}));
  EXPECT_EQ(Timers(2).IntervalTimers().size(), static_cast<size_t>(kNumTimers - 1));
}

TEST(TimersTest, MinMaxOverRanksWithOneAllReduce) {
  // Rank r ran forward-backward for (r + 1) x 10 ms over 2 iterations, and
  // only rank 1 ran the optimizer (4 ms); nobody ran params-all-gather.
  constexpr int kRanks = 3;
  std::vector<std::vector<TimerMinMax>> got(kRanks);
  absl::Status s = comm::testing::RunRanksAsThreads(kRanks, [&](int rank, comm::Communicator* c) {
    FakeClock clock;
    Timers t(1, clock.fn());
    t.Start(TimerId::kForwardBackward);
    clock.now += (rank + 1) * 10'000'000;
    t.Stop(TimerId::kForwardBackward);
    if (rank == 1) {
      t.Start(TimerId::kOptimizer);
      clock.now += 4'000'000;
      t.Stop(TimerId::kOptimizer);
    }
    absl::StatusOr<std::vector<TimerMinMax>> mm =
        t.MinMaxAcrossRanks(c, t.IntervalTimers(), /*normalizer=*/2, /*reset=*/true);
    if (!mm.ok()) return mm.status();
    got[rank] = *mm;
    if (t.Ran(TimerId::kForwardBackward) || t.Elapsed(TimerId::kForwardBackward, false) != 0) {
      return absl::InternalError("not reset");
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(got[r].size(), 2u) << "rank " << r;
    EXPECT_EQ(got[r][0].id, TimerId::kForwardBackward);
    EXPECT_DOUBLE_EQ(got[r][0].min_ms, 5.0);   // 10 ms / 2 iterations
    EXPECT_DOUBLE_EQ(got[r][0].max_ms, 15.0);  // 30 ms / 2
    EXPECT_EQ(got[r][1].id, TimerId::kOptimizer);
    EXPECT_DOUBLE_EQ(got[r][1].min_ms, 2.0);  // ranks 0 and 2 left out, not 0
    EXPECT_DOUBLE_EQ(got[r][1].max_ms, 2.0);
  }
  const std::vector<std::string> lines = Timers::Format(got[0]);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "(min, max) time across ranks (ms):");
  EXPECT_EQ(lines[1],
            "    forward-backward ...............................: (5.00, 15.00)");
  EXPECT_EQ(lines[2],
            "    optimizer ......................................: (2.00, 2.00)");
  EXPECT_TRUE(Timers::Format({}).empty());
}

TEST(TimersTest, PipelineBatchesGetMegatronsP2pNames) {
  auto name = [](std::vector<Action> batch) {
    return std::string(TimerName(ExecutorTimers::TimerOf(batch.data(), batch.size())));
  };
  const Action sa{ActionKind::kSendActivation, 0, 0, 1}, ra{ActionKind::kRecvActivation, 0, 0, 0};
  const Action sg{ActionKind::kSendGrad, 0, 0, 0}, rg{ActionKind::kRecvGrad, 0, 0, 1};
  EXPECT_EQ(name({pipeline::Forward(0, 0)}), "forward-compute");
  EXPECT_EQ(name({pipeline::Backward(0, 0)}), "backward-compute");
  // A split backward's halves (zero-bubble schedules) are backward compute.
  EXPECT_EQ(name({Action{ActionKind::kBackwardInput, 0, 0, 0}}), "backward-compute");
  EXPECT_EQ(name({Action{ActionKind::kBackwardWeight, 0, 0, 0}}), "backward-compute");
  EXPECT_EQ(name({ra}), "forward-recv");
  EXPECT_EQ(name({sa}), "forward-send");
  EXPECT_EQ(name({rg}), "backward-recv");
  EXPECT_EQ(name({sg}), "backward-send");
  EXPECT_EQ(name({sa, rg}), "forward-send-backward-recv");
  EXPECT_EQ(name({sg, ra}), "backward-send-forward-recv");
  EXPECT_EQ(name({sa, ra}), "forward-send-forward-recv");
  EXPECT_EQ(name({sg, rg}), "backward-send-backward-recv");
  EXPECT_EQ(name({sa, rg, sg, ra}), "forward-backward-send-forward-backward-recv");
}

TEST(TimersTest, TimersAreSpansOnlyInsideTheProfileWindow) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/timers_spans";
  absl::Status s = comm::testing::RunRanksAsThreads(1, [&](int rank, comm::Communicator* c) {
    profile::ProfileOptions o;
    o.dir = dir;
    o.step_start = 1;
    o.step_end = 2;
    absl::StatusOr<std::unique_ptr<profile::Profiler>> p = profile::Profiler::Create(o, rank);
    if (!p.ok()) return p.status();
    Timers t(0);  // level 0: forward-compute is off unless profiling
    t.set_profiler(p->get());
    ExecutorTimers exec(&t);
    const Action f = pipeline::Forward(3, 1);
    auto step = [&](int64_t iteration) -> absl::Status {
      absl::Status st = (*p)->BeforeStep(iteration, c);
      if (!st.ok()) return st;
      exec.Begin(&f, 1);
      exec.End(&f, 1);
      return (*p)->AfterStep(iteration + 1, c, nullptr);
    };
    for (int64_t i = 0; i < 3; ++i) {
      absl::Status st = step(i);
      if (!st.ok()) return st;
      const size_t want = i == 0 ? 0 : 1;  // the window is step 2 only
      if ((*p)->events().size() != want) {
        return absl::InternalError(absl::StrCat("after step ", i + 1, ": ",
                                                (*p)->events().size(), " spans"));
      }
    }
    const profile::Event e = (*p)->events()[0];
    if (e.name != "forward-compute" || e.cat != "compute" || e.track != "main" ||
        e.args != "{\"micro_batch\":3,\"chunk\":1}") {
      return absl::InternalError(absl::StrCat("span ", e.name, " ", e.cat, " ", e.args));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// A split backward (zb-h1): the units' input halves drawn in the I action and
// their weight halves in the W action, each inside its backward-compute.
TEST(TimersTest, SplitBackwardDrawsInputAndWeightSpansPerUnit) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/timers_split";
  absl::Status s = comm::testing::RunRanksAsThreads(1, [&](int rank, comm::Communicator* c) {
    profile::ProfileOptions o;
    o.dir = dir;
    o.step_start = 0;
    o.step_end = 1;
    absl::StatusOr<std::unique_ptr<profile::Profiler>> p = profile::Profiler::Create(o, rank);
    if (!p.ok()) return p.status();
    Timers t(0);
    t.set_profiler(p->get());
    ExecutorTimers exec(&t, /*head_unit=*/4);
    if (absl::Status st = (*p)->BeforeStep(0, c); !st.ok()) return st;
    const Action i = pipeline::BackwardInput(0, 0), w = pipeline::BackwardWeight(0, 0);
    exec.Begin(&i, 1);
    for (int64_t unit : {4, 3, 2}) {
      if (absl::Status st = exec.BeforeBackward(unit); !st.ok()) return st;
    }
    exec.End(&i, 1);
    exec.Begin(&w, 1);
    for (int64_t unit : {4, 3, 2}) {
      if (absl::Status st = exec.AfterBackward(unit); !st.ok()) return st;
    }
    exec.End(&w, 1);
    std::multiset<std::string> names;
    for (const profile::Event& e : (*p)->events()) names.insert(e.name);
    const std::multiset<std::string> want = {
        "backward-compute",        "backward-compute",        "backward-input output-layer",
        "backward-input layer 3",  "backward-input layer 2",  "backward-weight output-layer",
        "backward-weight layer 3", "backward-weight layer 2"};
    if (names != want) {
      return absl::InternalError(absl::StrCat("spans: ", absl::StrJoin(names, ", ")));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace loom::train
