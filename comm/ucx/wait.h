#ifndef LOOM_COMM_UCX_WAIT_H_
#define LOOM_COMM_UCX_WAIT_H_

// The wait loop of the ucx transport (communicator.cc), apart from UCX so
// that its timing can be tested with a fake worker (wait_test.cc).

#include <sched.h>

#include <algorithm>
#include <atomic>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/internal/clock.h"

namespace loom::comm::ucx {

// One pass of a wait: the worker progressed (`events`: what
// ucp_worker_progress returned) and whether every awaited request is done.
struct WaitPass {
  unsigned events = 0;
  bool done = false;
};

// An idle wait spins this long (for latency, and collectives' steps wait
// less), then naps.
inline constexpr absl::Duration kSpinBeforeNap = absl::Milliseconds(5);
// The clock (deadline) is read every this many passes, whatever the traffic:
// a pass is a fraction of a microsecond, a clock read a sizable part of one.
inline constexpr int kPassesPerClockRead = 16;

// Calls `pass()` (returns a WaitPass) until it reports done (OK), `deadline`
// passes (DeadlineExceeded) or `abort` becomes true (Cancelled). An idle wait
// spins a while, then naps. Cancels nothing. A template: the pass is inlined
// into the spin (no call through a std::function per pass).
template <typename Pass>
absl::Status WaitForRequests(Pass&& pass, absl::Time deadline, const std::atomic<bool>& abort) {
  int idle = 0;
  unsigned passes = 0;
  absl::Time idle_since = absl::InfinitePast();  // set at the first idle check
  for (;;) {
    const WaitPass p = pass();
    if (p.done) return absl::OkStatus();
    // Shutdown on every pass and the deadline by the clock every few passes:
    // other traffic on the worker (a sibling communicator's) must not
    // postpone them.
    if (abort.load(std::memory_order_relaxed)) {
      return absl::CancelledError("communicator shut down");
    }
    if (p.events) {
      idle = 0;
      idle_since = absl::InfinitePast();
      if ((++passes % kPassesPerClockRead) == 0 && internal::Now() >= deadline) {
        return absl::DeadlineExceededError("deadline");
      }
      continue;
    }
    ++idle;
    if ((++passes % kPassesPerClockRead) != 0 && (idle & 255) != 255) continue;
    const absl::Time now = internal::Now();
    if (now >= deadline) return absl::DeadlineExceededError("deadline");
    if ((idle & 255) != 255) continue;
    if (idle_since == absl::InfinitePast()) idle_since = now;
    const absl::Duration waited = now - idle_since;
    if (waited < kSpinBeforeNap) {
      sched_yield();
    } else {
      // A peer this far behind is computing: nap (a tenth of the wait so
      // far, 50 us to 1 ms) so this rank's core goes to the ranks doing the
      // work, at a cost of at most a tenth of the wait.
      absl::SleepFor(std::clamp(waited / 10, absl::Microseconds(50), absl::Milliseconds(1)));
    }
  }
}

}  // namespace loom::comm::ucx

#endif  // LOOM_COMM_UCX_WAIT_H_
