#ifndef LOOM_COMM_NCCL_SETTLE_H_
#define LOOM_COMM_NCCL_SETTLE_H_

// Waiting, under a communicator's lock, for a non-blocking NCCL communicator
// to settle (ncclInProgress -> a final state). Plain C++ (no NCCL, no CUDA),
// so the locking is tested on any machine (settle_test.cc).

#include <sched.h>

#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom::comm::nccl {

// Calls `settled()` with `lock` held until it returns true (then returns
// true) or `deadline` passes (returns false), backing off between calls
// (yield, then 200 us sleeps). The wait can last up to an op timeout (NCCL
// connecting to a peer that never comes), so the lock is released during
// each back-off: the communicator's watchdog takes it within one back-off
// and can time out or abort meanwhile. `settled()` must therefore check
// first for what others may have changed (an abort). `lock` is held again
// on return.
template <typename Settled>
bool WaitUntilSettled(std::unique_lock<std::mutex>& lock, absl::Time deadline, Settled settled) {
  for (int spins = 0;; ++spins) {
    if (settled()) return true;
    if (absl::Now() >= deadline) return false;
    lock.unlock();
    if (spins < 100) {
      sched_yield();
    } else {
      absl::SleepFor(absl::Microseconds(200));
    }
    lock.lock();
  }
}

}  // namespace loom::comm::nccl

#endif  // LOOM_COMM_NCCL_SETTLE_H_
