// The flight recorder on the local backend (ranks as threads): a rank that
// stops issuing collectives on purpose, the others time out and dump, and
// the analyzer names the rank that stopped; SIGUSR1 dumps without
// disturbing a run.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/flight/analyze.h"
#include "comm/flight/dump.h"
#include "comm/local/communicator.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace loom::comm {
namespace {

using core::DType;
using core::Tensor;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name, ".", getpid());
}

local::LocalOptions Options(const std::string& dir, absl::Duration timeout) {
  local::LocalOptions o;
  o.comm.timeout = timeout;
  o.comm.flight_recorder_dir = dir;
  o.comm.flight_recorder_entries = 64;
  return o;
}

absl::Status AllReduce(Communicator* c, int n) {
  Tensor t = *Tensor::Empty({n}, DType::kF32);
  for (int i = 0; i < n; ++i) t.data<float>()[i] = 1;
  return c->AllReduce(t, ReduceOp::kSum)->Wait();
}

TEST(FlightLocal, TheAnalyzerNamesTheRankThatStoppedIssuing) {
  const std::string dir = TestDir("stall");
  testing::RankStatuses st = testing::RunRanksAsThreadsEach(
      3,
      [&](int rank, Communicator* c) -> absl::Status {
        for (int i = 0; i < 5; ++i) {
          if (rank == 1 && i == 3) return absl::OkStatus();  // stops, stays alive
          absl::Status s = AllReduce(c, 1024);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      },
      Options(dir, absl::Seconds(2)));
  EXPECT_TRUE(st.each[1].ok()) << st.each[1];
  for (int r : {0, 2}) EXPECT_TRUE(absl::IsDeadlineExceeded(st.each[r])) << st.each[r];
  auto dumps = flight::ReadDumpDir(dir);
  ASSERT_TRUE(dumps.ok()) << dumps.status();
  ASSERT_EQ(dumps->size(), 3u);  // one per rank (all threads of this process)
  flight::Analysis a = flight::Analyze(*dumps);
  const std::string t = a.Report();
  EXPECT_EQ(a.exit_code(), 1) << t;
  EXPECT_EQ(a.culprits, std::vector<int>{1}) << t;
  EXPECT_NE(t.find("group 'world' (world ranks 0,1,2): all_reduce #3 (f32, 4096 B): issued by "
                   "ranks 0, 2; never issued by rank 1 (its last op: all_reduce #2, completed "),
            std::string::npos)
      << t;
}

TEST(FlightLocal, SplitGroupsAreNamedByTheirWorldRanks) {
  // tp groups {0,1} and {2,3}; rank 3 stops issuing on its tp group.
  const std::string dir = TestDir("split");
  testing::RankStatuses st = testing::RunRanksAsThreadsEach(
      4,
      [&](int rank, Communicator* world) -> absl::Status {
        auto tp = world->Split(rank / 2, rank, "tp");
        if (!tp.ok()) return tp.status();
        for (int i = 0; i < 4; ++i) {
          if (rank == 3 && i == 2) {  // busy elsewhere past rank 2's timeout
            absl::SleepFor(absl::Seconds(3));
            return absl::OkStatus();
          }
          absl::Status s = AllReduce(tp->get(), 16);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      },
      Options(dir, absl::Seconds(2)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st.each[2])) << st.each[2];
  for (int r : {0, 1, 3}) EXPECT_TRUE(st.each[r].ok()) << st.each[r];
  auto dumps = flight::ReadDumpDir(dir);
  ASSERT_TRUE(dumps.ok()) << dumps.status();
  flight::Analysis a = flight::Analyze(*dumps);
  const std::string t = a.Report();
  EXPECT_EQ(a.culprits, std::vector<int>{3}) << t;
  EXPECT_NE(t.find("group 'tp' (world ranks 2,3): all_reduce #2 (f32, 64 B): issued by rank 2; "
                   "never issued by rank 3 (its last op: all_reduce #1, completed "),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("group 'tp' (world ranks 0,1)"), std::string::npos) << t;
}

TEST(FlightLocal, Sigusr1DumpsWithoutDisturbingTheRun) {
  const std::string dir = TestDir("usr1");
  absl::Status s = testing::RunRanksAsThreads(
      2,
      [&](int rank, Communicator* c) -> absl::Status {
        for (int i = 0; i < 2000; ++i) {
          if (rank == 0 && i == 500) {
            // The recorder's handler is installed (the world has a folder);
            // its thread dumps while rank 1 waits in all_reduce #500.
            raise(SIGUSR1);
            const absl::Time until = absl::Now() + absl::Seconds(10);
            while (access(flight::DumpPath(dir, 1).c_str(), F_OK) != 0 && absl::Now() < until) {
              absl::SleepFor(absl::Milliseconds(5));
            }
          }
          absl::Status s = AllReduce(c, 256);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      },
      Options(dir, absl::Seconds(20)));
  EXPECT_TRUE(s.ok()) << s;
  auto dumps = flight::ReadDumpDir(dir);
  ASSERT_TRUE(dumps.ok()) << dumps.status();
  ASSERT_EQ(dumps->size(), 2u);
  for (const flight::RankDump& d : *dumps) {
    EXPECT_EQ(d.reason, "SIGUSR1");
    ASSERT_EQ(d.comms.size(), 1u);
    EXPECT_EQ(d.comms[0].issued, d.world_rank == 0 ? 500u : 501u);
  }
  // Rank 1 waits in #500, which rank 0 has not issued yet.
  flight::Analysis a = flight::Analyze(*dumps);
  EXPECT_EQ(a.culprits, std::vector<int>{0}) << a.Report();
}

}  // namespace
}  // namespace loom::comm
