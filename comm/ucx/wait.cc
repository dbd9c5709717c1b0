#include "comm/ucx/wait.h"

#include <sched.h>

#include <algorithm>

namespace loom::comm::ucx {

// An idle wait spins this long (for latency, and collectives' steps wait
// less), then naps.
constexpr absl::Duration kSpinBeforeNap = absl::Milliseconds(5);

absl::Status WaitForRequests(const std::function<WaitPass()>& pass, absl::Time deadline,
                             const std::atomic<bool>& abort) {
  int idle = 0;
  absl::Time idle_since = absl::InfinitePast();  // set at the first idle check
  for (;;) {
    const WaitPass p = pass();
    if (p.done) return absl::OkStatus();
    // Shutdown and the deadline by the clock, on every pass: other traffic
    // on the worker (a sibling communicator's) must not postpone them.
    if (abort) return absl::CancelledError("communicator shut down");
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("deadline");
    if (p.events) {
      idle = 0;
      idle_since = absl::InfinitePast();
      continue;
    }
    if ((++idle & 255) != 255) continue;
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
