#ifndef LOOM_COMM_TESTING_CONFORMANCE_H_
#define LOOM_COMM_TESTING_CONFORMANCE_H_

// The one conformance suite every backend runs. Each case is a body that
// every rank of a world runs on its own communicator; it returns OK or an
// error naming the op, dtype, count, layout, rank, index, got and expected.
// Expected values come from (rank, size, index) alone. Harnesses:
//   local: threads (comm/local/communicator_test.cc);
//   mpi:   mpirun of conformance_main (comm/mpi/*.sh);
//   ucx:   conformance_main --nproc-per-node (comm/ucx/*.sh);
//   nccl:  threads, one per GPU (comm/nccl/communicator_test.cc), and
//          comm/nccl:conformance_main; host tensors are mirrored to the GPU
//          (comm/nccl/host_mirror.h), so the cases stay host code.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/comm.h"

namespace loom::comm::testing {

struct SuiteOptions {
  // Element counts tried for every op; the last is the multi-MiB one, sized
  // in bytes (large_bytes / dtype size elements).
  std::vector<int64_t> counts = {0, 1, 7, 1000};
  size_t large_bytes = 2 << 20;
  // The backend reports cross-rank call mismatches as errors (our engine
  // does; MPI makes them undefined behaviour, so that case is skipped).
  bool detects_mismatch = true;
  // The backend routes point-to-point messages by tag (ours do). False for
  // NCCL, which matches a pair's messages in issue order and whose sends may
  // wait for the matching receive: the send/recv case then receives in the
  // order sent, with even ranks sending first and odd ranks receiving first.
  bool p2p_matches_tags = true;
};

struct Case {
  std::string name;
  std::function<absl::Status(Communicator& world)> body;
};

std::vector<Case> Cases(const SuiteOptions& options = {});

// The dead-peer case. All ranks but `victim` run an all-to-all-v (in a
// child of `world`) and then an all-reduce, each of which must fail with
// DeadlineExceeded within the communicator's timeout + `slack`; the victim
// calls `die` instead (kill itself, or for threads just return).
// `timeout` must be the communicator's CommOptions::timeout.
// `names_ranks`: the error must name the missing ranks ("did not arrive: [..]").
// `observed` (optional) receives the errors the survivor saw.
absl::Status DeadPeer(Communicator& world, int victim, const std::function<void()>& die,
                      absl::Duration timeout, absl::Duration slack, bool names_ranks,
                      std::string* observed = nullptr);

// The failed-op case (comm.h, FAILURE): what a communicator does with the
// buffers of an operation that failed. Ranks 0 and 1 take part (others only
// sync); `timeout` must be the world's CommOptions::timeout, short (the case
// waits for it about twice). On rank 0, in children of `world`:
//  * a 1 MiB send (rendezvous where the transport has one) and an
//    all-reduce to a late rank 1: the first to fail must be DeadlineExceeded,
//    the op queued behind it and a later one must fail at once with
//    FailedPrecondition naming it;
//  * a receive whose communicator is destroyed while it is posted
//    (Cancelled);
// then rank 0 drops every tensor and handle, and rank 1 comes late: it
// receives the send and sends the message of the receive. A buffer that the
// communicator let go is overwritten at once (the memory is the case's own),
// so a transport that still reads or writes it is caught: rank 1 must
// receive the payload (or fail), never the overwrite, and the receive's
// memory must keep the overwrite.
absl::Status FailedOpKeepsBuffers(Communicator& world, absl::Duration timeout);

}  // namespace loom::comm::testing

#endif  // LOOM_COMM_TESTING_CONFORMANCE_H_
