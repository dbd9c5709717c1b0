// The flight recorder on the nccl backend: two ranks (threads, one GPU
// each); rank 1 stops issuing collectives; rank 0's all-reduce times out
// (the watchdog or its wait), it dumps the process (both ranks) and the
// analyzer names rank 1. Skipped, with the reason, without two GPUs.
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/flight/analyze.h"
#include "comm/flight/dump.h"
#include "comm/nccl/communicator.h"
#include "comm/nccl/device_memory.h"
#include "comm/store/memory_store.h"
#include "comm/testing/ranks_as_threads.h"
#include "gtest/gtest.h"

namespace loom::comm {
namespace {

TEST(FlightNccl, TheAnalyzerNamesTheRankThatStoppedIssuing) {
  absl::StatusOr<int> gpus = nccl::GpuCount();
  if (!gpus.ok()) GTEST_SKIP() << "skipped: no GPU on this machine (" << gpus.status() << ")";
  if (*gpus < 2) GTEST_SKIP() << "skipped: needs 2 GPUs, this machine has " << *gpus;
  nccl::EnsureCudaAllocator();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/nccl_stall.", getpid());
  auto store = std::make_shared<MemoryStore>();
  testing::RankStatuses st = testing::RunThreads(2, [&](int r) -> absl::Status {
    nccl::NcclOptions o;
    o.local_rank = r;
    o.generation = 0;
    o.comm.timeout = absl::Seconds(3);
    o.comm.flight_recorder_dir = dir;
    auto c = nccl::Create(r, 2, store, o);
    if (!c.ok()) return c.status();
    auto t = nccl::EmptyOnDevice({1024}, core::DType::kF32, (*c)->device());
    if (!t.ok()) return t.status();
    for (int i = 0; i < 4; ++i) {
      if (r == 1 && i == 2) {  // stops, alive past rank 0's timeout
        absl::SleepFor(absl::Seconds(6));
        return absl::OkStatus();
      }
      absl::Status s = (*c)->AllReduce(*t, ReduceOp::kSum)->Wait();
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsDeadlineExceeded(st.each[0])) << st.each[0];
  EXPECT_TRUE(st.each[1].ok()) << st.each[1];
  auto dumps = flight::ReadDumpDir(dir);
  ASSERT_TRUE(dumps.ok()) << dumps.status();
  flight::Analysis a = flight::Analyze(*dumps);
  const std::string text = a.Report();
  EXPECT_EQ(a.culprits, std::vector<int>{1}) << text;
  EXPECT_NE(text.find("all_reduce #2 (f32, 4096 B): issued by rank 0; never issued by rank 1 "
                      "(its last op: all_reduce #1, completed "),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace loom::comm
