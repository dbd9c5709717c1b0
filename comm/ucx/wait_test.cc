// The ucx transport's wait loop over a fake worker (issue #14, item 9).
#include "comm/ucx/wait.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace loom::comm::ucx {
namespace {

// A sibling communicator's traffic on the shared worker: every progress call
// handles some event, for `busy`, while the awaited requests never finish.
// The deadline must still fire on time: before the fix it was checked only
// after 256 consecutive idle passes, so it fired only once the traffic
// stopped (here after `busy`; in a job, possibly never).
TEST(UcxWait, DeadlineCheckedByClockUnderSiblingTraffic) {
  const absl::Duration busy = absl::Seconds(3);
  const absl::Time start = absl::Now();
  std::atomic<bool> abort{false};
  absl::Status s = WaitForRequests(
      [&] { return WaitPass{absl::Now() - start < busy ? 1u : 0u, false}; },
      start + absl::Milliseconds(200), abort);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(took, absl::Milliseconds(700)) << "the deadline fired only after the traffic stopped";
}

// Shutdown (the abort flag) is seen as promptly, traffic or not.
TEST(UcxWait, AbortCheckedByClockUnderSiblingTraffic) {
  const absl::Duration busy = absl::Seconds(3);
  const absl::Time start = absl::Now();
  std::atomic<bool> abort{false};
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(200));
    abort = true;
  });
  absl::Status s = WaitForRequests(
      [&] { return WaitPass{absl::Now() - start < busy ? 1u : 0u, false}; },
      start + absl::Hours(1), abort);
  const absl::Duration took = absl::Now() - start;
  stopper.join();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_LT(took, absl::Milliseconds(700)) << "the abort was seen only after the traffic stopped";
}

TEST(UcxWait, ReturnsWhenDone) {
  std::atomic<bool> abort{false};
  int passes = 0;
  absl::Status s = WaitForRequests([&] { return WaitPass{0, ++passes == 3}; },
                                   absl::InfiniteFuture(), abort);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(passes, 3);
}

}  // namespace
}  // namespace loom::comm::ucx
