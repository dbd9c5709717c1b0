#include "comm/testing/ranks_as_threads.h"

#include <atomic>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace loom::comm::testing {
namespace {

TEST(RanksAsThreads, EveryRankGetsItsCommunicatorOfOneWorld) {
  std::atomic<int> ran{0};
  absl::Status s = RunRanksAsThreads(3, [&](int rank, Communicator* c) {
    ++ran;
    if (c->rank() != rank || c->size() != 3) return absl::InternalError("wrong rank or size");
    auto t = core::Tensor::Empty({1}, core::DType::kI32);
    t->data<int32_t>()[0] = rank;
    absl::Status st = c->AllReduce(*t, ReduceOp::kSum)->Wait();
    if (st.ok() && t->data<int32_t>()[0] != 3) st = absl::InternalError("wrong sum");
    return st;
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ran, 3);
}

TEST(RanksAsThreads, FirstErrorInTimeIsReportedWithItsRank) {
  RankStatuses st = RunRanksAsThreadsEach(3, [](int rank, Communicator*) {
    if (rank == 0) absl::SleepFor(absl::Milliseconds(200));  // fails later
    return rank == 1 ? absl::OkStatus() : absl::NotFoundError("no such thing");
  });
  ASSERT_EQ(st.each.size(), 3u);
  EXPECT_TRUE(absl::IsNotFound(st.each[0])) << st.each[0];
  EXPECT_TRUE(st.each[1].ok());
  EXPECT_EQ(st.each[2].message(), "no such thing");  // unchanged
  EXPECT_TRUE(absl::IsNotFound(st.first)) << st.first;
  EXPECT_EQ(st.first.message(), "rank 2: no such thing");
}

TEST(RanksAsThreads, LowestFailingRankIsReportedToo) {
  RankStatuses st = RunRanksAsThreadsEach(3, [](int rank, Communicator*) {
    if (rank == 1) absl::SleepFor(absl::Milliseconds(200));  // fails last in time
    return rank == 0 ? absl::OkStatus()
                     : absl::InternalError(absl::StrCat("from rank ", rank));
  });
  EXPECT_EQ(st.first.message(), "rank 2: from rank 2");
  EXPECT_TRUE(absl::IsInternal(st.lowest)) << st.lowest;
  EXPECT_EQ(st.lowest.message(), "rank 1: from rank 1");
  RankStatuses ok = RunThreads(2, [](int) { return absl::OkStatus(); });
  EXPECT_TRUE(ok.lowest.ok()) << ok.lowest;
}

TEST(RanksAsThreads, BareThreadsAndABadWorld) {
  RankStatuses st = RunThreads(2, [](int rank) {
    return rank == 1 ? absl::InternalError("boom") : absl::OkStatus();
  });
  EXPECT_EQ(st.first.message(), "rank 1: boom");
  for (int size : {0, 1 << 20}) {
    RankStatuses bad =
        RunRanksAsThreadsEach(size, [](int, Communicator*) { return absl::OkStatus(); });
    EXPECT_TRUE(absl::IsInvalidArgument(bad.first)) << bad.first;
    EXPECT_EQ(bad.lowest, bad.first);
    EXPECT_TRUE(absl::StrContains(bad.first.message(), absl::StrCat("world size ", size)))
        << bad.first;
    EXPECT_EQ(bad.each.size(), static_cast<size_t>(size == 0 ? 0 : size));
  }
}

}  // namespace
}  // namespace loom::comm::testing
