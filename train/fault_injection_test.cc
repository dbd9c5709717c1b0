// LOOM_FAULT: the syntax (and its errors, naming the variable), which rank
// and start a fault fires in, and each kind as it fires (death tests: the
// process exits 3, is killed, hangs; a collective nobody else joins times
// out; a shard file is left half written; a slow rank sleeps in every step
// from its iteration on).
#include "train/fault_injection.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include "checkpoint/writer.h"
#include "comm/testing/ranks_as_threads.h"
#include "gtest/gtest.h"

namespace loom::train {
namespace {

std::vector<Fault> Parsed(const std::string& spec) {
  absl::StatusOr<std::vector<Fault>> f = ParseFaults(spec);
  EXPECT_TRUE(f.ok()) << spec << ": " << f.status();
  return f.ok() ? *f : std::vector<Fault>();
}

std::string ErrorOf(const std::string& spec) {
  absl::StatusOr<std::vector<Fault>> f = ParseFaults(spec);
  EXPECT_FALSE(f.ok()) << spec << " should be refused";
  return f.ok() ? "" : std::string(f.status().message());
}

TEST(FaultInjectionTest, ParsesTheSyntax) {
  EXPECT_TRUE(Parsed("").empty());
  std::vector<Fault> f = Parsed("rank=1,iteration=5,kind=sigkill");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].global_rank, 1);
  EXPECT_EQ(f[0].iteration, 5);
  EXPECT_EQ(f[0].kind, FaultKind::kSigkill);
  EXPECT_EQ(f[0].attempt, 0);  // the first start only
  EXPECT_EQ(f[0].Describe(), "rank=1 iteration=5 kind=sigkill attempt=0");

  f = Parsed("kind=save,attempt=2,iteration=8,rank=0;rank=3,iteration=1,kind=hang,attempt=any");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].kind, FaultKind::kSave);
  EXPECT_EQ(f[0].attempt, 2);
  EXPECT_EQ(f[0].iteration, 8);
  EXPECT_EQ(f[1].global_rank, 3);
  EXPECT_EQ(f[1].kind, FaultKind::kHang);
  EXPECT_EQ(f[1].attempt, Fault::kAnyAttempt);
  f = Parsed("rank=1,iteration=3,kind=slow,ms=250");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, FaultKind::kSlow);
  EXPECT_EQ(f[0].delay_ms, 250);
  EXPECT_EQ(f[0].Describe(), "rank=1 iteration=3 kind=slow ms=250 attempt=0");
  for (const char* kind : {"exit", "sigkill", "hang", "collective", "save"}) {
    f = Parsed(std::string("rank=0,iteration=1,kind=") + kind);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_STREQ(FaultKindName(f[0].kind), kind);
  }
}

TEST(FaultInjectionTest, MalformedValuesNameTheVariableAndWhatIsWrong) {
  struct Case {
    std::string spec, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"rank=1,iteration=5", "lacks kind"},
           {"iteration=5,kind=exit", "lacks rank"},
           {"rank=1,kind=exit", "lacks iteration"},
           {"rank=1,iteration=5,kind=boom", "unknown kind=boom"},
           {"rank=-1,iteration=5,kind=exit", "rank=-1 is not a rank >= 0"},
           {"rank=x,iteration=5,kind=exit", "rank=x is not a rank >= 0"},
           {"rank=1,iteration=0,kind=exit", "iteration=0 is not an iteration >= 1"},
           {"rank=1,iteration=5,kind=exit,attempt=-2", "attempt=-2 is not a restart count"},
           {"rank=1,iteration=5,kind=exit,when=now", "unknown key 'when'"},
           {"rank=1,iteration=5,kind=exit,rank=2", "rank given twice"},
           {"rank=1,iteration=5,kind=exit;", "an empty fault"},
           {"rank=1 iteration=5 kind=exit", "spaces are not allowed"},
           {"rank=1,iteration=5,kind", "'kind' is not key=value"},
           {"rank=1,iteration=5,kind=slow", "lacks ms (kind=slow's delay per step)"},
           {"rank=1,iteration=5,kind=slow,ms=0", "ms=0 is not a delay of 1..3600000 ms"},
           {"rank=1,iteration=5,kind=slow,ms=-5", "ms=-5 is not a delay"},
           {"rank=1,iteration=5,kind=slow,ms=fast", "ms=fast is not a delay"},
           {"rank=1,iteration=5,kind=slow,ms=3600001", "ms=3600001 is not a delay"},
           {"rank=1,iteration=5,kind=slow,ms=5,ms=6", "ms given twice"},
           {"rank=1,iteration=5,kind=exit,ms=5", "ms is kind=slow's delay, not kind=exit's"},
       }) {
    const std::string message = ErrorOf(c.spec);
    EXPECT_NE(message.find("LOOM_FAULT=" + c.spec + ": "), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.spec << ": " << message;
    EXPECT_NE(message.find("expected rank=R,iteration=N,kind="), std::string::npos) << message;
  }
  // Possible in this run: the rank exists, the iteration comes.
  EXPECT_TRUE(ValidateFaults("rank=1,iteration=20,kind=exit", 2, 20).ok());
  absl::Status s = ValidateFaults("rank=2,iteration=5,kind=exit", 2, 20);
  EXPECT_NE(s.message().find("rank=2 is outside the world of 2 ranks"), std::string::npos) << s;
  s = ValidateFaults("rank=0,iteration=2,kind=collective", 1, 20);
  EXPECT_NE(s.message().find("kind=collective needs a world of at least 2 ranks"),
            std::string::npos)
      << s;
  s = ValidateFaults("rank=0,iteration=21,kind=exit", 2, 20);
  EXPECT_NE(s.message().find("iteration=21 is past --train-iters (20)"), std::string::npos) << s;
}

TEST(FaultInjectionTest, FiresOnlyOnItsRankAndStart) {
  const std::string spec = "rank=1,iteration=5,kind=exit;rank=0,iteration=3,kind=exit,attempt=1";
  EXPECT_TRUE(FaultInjector::Create("", 0, 0)->empty());
  EXPECT_FALSE(FaultInjector::Create(spec, 1, 0)->empty());
  EXPECT_TRUE(FaultInjector::Create(spec, 1, 1)->empty());  // the restarted job does not fail again
  EXPECT_TRUE(FaultInjector::Create(spec, 0, 0)->empty());
  EXPECT_FALSE(FaultInjector::Create(spec, 0, 1)->empty());
  EXPECT_FALSE(FaultInjector::Create("rank=0,iteration=3,kind=hang,attempt=any", 0, 7)->empty());
  EXPECT_FALSE(FaultInjector::Create("rank=0,iteration=3,kind=nope", 0, 0).ok());
  // Other iterations (and kind=save at a step) pass.
  FaultInjector f = *FaultInjector::Create("rank=0,iteration=5,kind=exit;rank=0,iteration=2,"
                                           "kind=save", 0, 0);
  for (int64_t i : {1, 2, 3, 4, 6}) EXPECT_TRUE(f.AtStep(i, nullptr).ok());
  f.BeforeSave(3);  // not its iteration: nothing armed
}

TEST(FaultInjectionTest, SlowSleepsInEveryStepFromItsIteration) {
  const std::string spec = "rank=1,iteration=3,kind=slow,ms=1000";
  FaultInjector other = *FaultInjector::Create(spec, 0, 0);
  EXPECT_TRUE(other.empty());
  FaultInjector f = *FaultInjector::Create(spec, 1, 0);
  auto elapsed_ms = [&f](int64_t iteration) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(f.AtStep(iteration, nullptr).ok());  // not a step fault: returns at once
    f.InCompute(iteration);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  // Before its iteration nothing sleeps (half the delay: a bound a busy
  // machine cannot reach); from it on every step sleeps at least the delay.
  EXPECT_LT(elapsed_ms(1), 500);
  EXPECT_LT(elapsed_ms(2), 500);
  ::testing::internal::CaptureStderr();
  for (int64_t i : {3, 7}) EXPECT_GE(elapsed_ms(i), 1000) << "iteration " << i;
  const std::string err = ::testing::internal::GetCapturedStderr();
  // Announced once, at the first slowed step.
  EXPECT_NE(err.find("LOOM_FAULT fires: rank=1 iteration=3 kind=slow ms=1000 attempt=0 "
                     "(sleeping 1000 ms in the forward-backward of iteration 3"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("fires", err.find("fires") + 1), std::string::npos) << err;
}

using FaultInjectionDeathTest = ::testing::Test;

TEST(FaultInjectionDeathTest, ExitSigkillAndHangFireAtTheirStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(FaultInjector::Create("rank=0,iteration=5,kind=exit", 0, 0)->AtStep(5, nullptr)
                  .IgnoreError(),
              ::testing::ExitedWithCode(3),
              "LOOM_FAULT fires: rank=0 iteration=5 kind=exit attempt=0");
  EXPECT_EXIT(FaultInjector::Create("rank=2,iteration=1,kind=sigkill,attempt=any", 2, 4)
                  ->AtStep(1, nullptr)
                  .IgnoreError(),
              ::testing::KilledBySignal(SIGKILL), "kind=sigkill attempt=any");
  // A hang never returns: SIGALRM ends the child after it announced it.
  EXPECT_EXIT(
      {
        alarm(1);
        FaultInjector::Create("rank=0,iteration=2,kind=hang", 0, 0)->AtStep(2, nullptr)
            .IgnoreError();
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGALRM), "kind=hang attempt=0 \\(no more heartbeats");
}

TEST(FaultInjectionTest, CollectiveTimesOutOnEveryRank) {
  comm::local::LocalOptions o;
  o.comm.timeout = absl::Milliseconds(300);
  comm::testing::RankStatuses s = comm::testing::RunRanksAsThreadsEach(
      2,
      [](int rank, comm::Communicator* world) -> absl::Status {
        // As in the trainer: the steps' collectives run on groups split
        // off the world, the fault's barrier on the world itself.
        auto group = world->Split(0, rank, "dp");
        if (!group.ok()) return group.status();
        FaultInjector f = *FaultInjector::Create("rank=1,iteration=4,kind=collective", rank, 0);
        auto one = core::Tensor::Zeros(core::Shape{1}, core::DType::kF32);
        for (int64_t i = 1; i <= 4; ++i) {
          absl::Status s = f.AtStep(i, world);
          if (!s.ok()) return s;
          s = (*group)->AllReduce(*one, comm::ReduceOp::kSum)->Wait();
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      },
      o);
  ASSERT_EQ(s.each.size(), 2u);
  EXPECT_FALSE(s.each[0].ok());
  EXPECT_FALSE(s.each[1].ok());
  EXPECT_NE(s.each[1].message().find("LOOM_FAULT rank=1 iteration=4 kind=collective"),
            std::string::npos)
      << s.each[1];
}

TEST(FaultInjectionDeathTest, SaveKillsInTheMiddleOfTheShardFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/shard.bin";
  std::vector<float> data(1000, 1.0f);
  std::vector<checkpoint::Piece> pieces(4);
  for (int i = 0; i < 4; ++i) {
    pieces[i].name = "t" + std::to_string(i);
    pieces[i].global_shape = {1000};
    pieces[i].region = checkpoint::Region::Rect(0, 1000, 0, 1);
    pieces[i].data = data.data();
  }
  // Not armed (another iteration, another rank): the file is written whole.
  FaultInjector(*FaultInjector::Create("rank=1,iteration=4,kind=save", 1, 0)).BeforeSave(3);
  ASSERT_TRUE(checkpoint::WriteShardFile(path, 1, pieces).ok());
  struct stat whole;
  ASSERT_EQ(stat(path.c_str(), &whole), 0);
  EXPECT_EQ(whole.st_size, checkpoint::kShardHeaderBytes + 4 * 4000);
  EXPECT_EXIT(
      {
        FaultInjector f = *FaultInjector::Create("rank=1,iteration=4,kind=save", 1, 0);
        f.BeforeSave(4);
        (void)checkpoint::WriteShardFile(path, 0, pieces);  // rank 0: not the armed rank
        (void)checkpoint::WriteShardFile(path, 1, pieces);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "kind=save attempt=0 \\(SIGKILL with .*shard.bin half");
  struct stat half;
  ASSERT_EQ(stat(path.c_str(), &half), 0);
  EXPECT_EQ(half.st_size, checkpoint::kShardHeaderBytes + 2 * 4000);  // two of four pieces
  // A rank with nothing to save (plain DP: replicated weights are saved by
  // DP rank 0) still dies in its write, with the header on disk.
  EXPECT_EXIT(
      {
        FaultInjector f = *FaultInjector::Create("rank=1,iteration=4,kind=save", 1, 0);
        f.BeforeSave(4);
        (void)checkpoint::WriteShardFile(path, 1, {});
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "kind=save");
  ASSERT_EQ(stat(path.c_str(), &half), 0);
  EXPECT_EQ(half.st_size, checkpoint::kShardHeaderBytes);
}

}  // namespace
}  // namespace loom::train
