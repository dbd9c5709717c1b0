#ifndef LOOM_COMM_UCX_WAIT_H_
#define LOOM_COMM_UCX_WAIT_H_

// The wait loop of the ucx transport (communicator.cc), apart from UCX so
// that its timing can be tested with a fake worker (wait_test.cc).

#include <atomic>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace loom::comm::ucx {

// One pass of a wait: the worker progressed once (`events`: what
// ucp_worker_progress returned) and whether every awaited request is done.
struct WaitPass {
  unsigned events = 0;
  bool done = false;
};

// Calls `pass` until it reports done (OK), `deadline` passes
// (DeadlineExceeded) or `abort` becomes true (Cancelled). An idle wait spins
// a while, then naps. Cancels nothing.
absl::Status WaitForRequests(const std::function<WaitPass()>& pass, absl::Time deadline,
                             const std::atomic<bool>& abort);

}  // namespace loom::comm::ucx

#endif  // LOOM_COMM_UCX_WAIT_H_
