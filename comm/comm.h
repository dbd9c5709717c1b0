#ifndef LOOM_COMM_COMM_H_
#define LOOM_COMM_COMM_H_

// The backend-agnostic collective interface. Layers and the pipeline depend
// on this header only; binaries and tests pick a backend (//comm:backends).
//
// CONTRACT (every backend; modelled on NCCL's):
//  * Every rank of a group calls each collective, in the same order, with the
//    same element count, dtype, reduce op and root. A mismatch is reported as
//    an error where the backend can detect it (message signature / length
//    checks in the local and UCX backends, MPI's own checks in the MPI one);
//    it is never silently accepted as a different operation.
//  * Every call is asynchronous: it validates its arguments, enqueues the
//    operation and returns a Work handle at once. Tensors must stay alive and
//    unmodified (outputs: unread) until the handle reports success; once it
//    reports an error the caller may drop them (see FAILURE).
//  * Operations of one communicator start in issue order (collectives also
//    complete in it; a point-to-point op may complete after later ones: see
//    POINT TO POINT). Any number may be in flight before the first Wait;
//    progress does not depend on anyone waiting.
//  * No infinite hang: an operation that does not finish within
//    CommOptions::timeout of starting fails with DeadlineExceeded naming the
//    op, the group, its sequence number and the ranks that did not arrive
//    (where the backend can know them). After such a failure the communicator
//    is aborted: later operations fail fast with FailedPrecondition (see
//    FAILURE).
//  * Bad arguments (dtype/shape mismatch, root, peer or tag out of range,
//    tensors not on the communicator's device(): the host for local, mpi and
//    ucx, its GPU for nccl) are reported through the returned handle, before
//    anything is sent, by the same checks with the same messages on every
//    backend. The rejected op still takes its sequence number and aborts the
//    communicator (later ops fail with FailedPrecondition naming the error):
//    the other ranks' op with that number can never complete, and this
//    rank's next op must never pair with it (MPI and NCCL would pair them
//    silently when count and dtype agree). Every backend.
//  * In-place is "same memory twice" as in NCCL: AllReduce/Broadcast/Reduce/
//    AllToAll with input == output; AllGather with input at output's slot
//    `rank`; ReduceScatter with output at input's slot `rank`. AllToAllV has
//    no in-place form.
//  * dtypes: f32, bf16, f16, f64, i32, i64, u8. bf16/f16 reductions are
//    computed in f32. kAvg on integers is the truncating integer division of
//    the sum.
//  * A communicator (and its Work handles) may be used from one thread at a
//    time; different communicators (e.g. from Split) may run concurrently.
//
// FAILURE (every backend; the conformance suite's FailedOpKeepsBuffers case,
// run by each backend's harness with a short timeout, tests exactly this):
//  * An operation that fails (DeadlineExceeded, a peer's failure, Cancelled
//    because its communicator was destroyed under it) aborts its
//    communicator: every operation pending on it and every later one fails
//    promptly with an error (FailedPrecondition) naming that first failure.
//  * Until the transport guarantees it will not touch them again (the
//    request completed, or was cancelled and the cancellation confirmed),
//    the communicator keeps alive every buffer the transport may still
//    access: the failed op's tensors (by reference), staging, transport
//    requests. At the latest it lets go when it and its transport endpoint
//    are destroyed (on local and ucx the endpoint is shared by a world and
//    every communicator Split from it). So a caller may drop a failed op's
//    handle and tensors at once: a peer's late message lands in memory the
//    communicator still holds, never in freed memory. A send cannot always
//    be cancelled: a failed send may still be delivered, from the kept
//    buffer.
//  * The contents of a failed op's output tensors are unspecified.
//
// POINT TO POINT (Send, Recv, BatchSendRecv; every backend, tested by the
// conformance suite's PointToPointOrder and CollectiveAfterUnequalPointToPoint):
//  * Matching: a send to `peer` with tag t meets a receive from the sender
//    with tag t, of the same dtype and element count (a mismatch is an error
//    on local and ucx, on mpi for counts; nccl cannot detect it). Between
//    two ranks, messages with one tag are received in the order sent: across
//    operations in issue order, within one BatchSendRecv in vector order.
//  * Routing: on local, ucx and mpi tags route messages (a receive takes the
//    oldest unreceived message from its peer with its tag, whatever else is
//    in flight). On nccl they do not: between two ranks the k-th send meets
//    the k-th receive, in issue order with the ops of one BatchSendRecv
//    ordered by tag (stably). Portable code issues a pair's sends and
//    receives in the same order and the same grouping on both sides.
//  * Completion: a send may complete before its receive is posted (local
//    always; ucx and mpi for small messages) or only once it is (nccl; large
//    messages on mpi, and on ucx when its ranks span hosts or UCX_TLS is
//    set). Neither is promised.
//  * Progress: a Recv or BatchSendRecv holds back the operations issued
//    after it on the communicator, collectives included, until it completes
//    (local, ucx; on nccl every op does, a Send too: one stream); mpi runs
//    them independently. Portable code completes when every op runs to
//    completion one at a time in issue order, a send finishing only when its
//    receive runs and the legs of one BatchSendRecv all at once. So
//    exchanges in both directions between two ranks go in one
//    BatchSendRecv, and a rank receives before it sends along a chain.
//  * Collectives ignore point-to-point traffic: point-to-point ops take no
//    collective sequence number and their messages never match a
//    collective's. A collective matches across ranks by its place among the
//    communicator's collectives alone, whatever number of point-to-point ops
//    each rank issued before or between them (pipeline stages issue
//    different numbers), as long as every send is received under the rules
//    above; no separate communicator is needed. Descriptions (Describe(),
//    DeadlineExceeded) number collectives and point-to-point ops in two
//    sequences: "all_reduce #k" has the same k on every rank.
//  * Tags: 0 <= tag < kMaxTag, all free for the caller (collectives use
//    none). An empty BatchSendRecv completes at once.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "core/tensor.h"

namespace loom::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin, kProd };
const char* ReduceOpName(ReduceOp op);  // "sum", "avg", ...

// Options shared by every backend; backends add their own in their headers.
struct CommOptions {
  // Per-operation limit, counted from when the operation starts executing.
  absl::Duration timeout = absl::Minutes(5);
  // Used in error messages ("tp", "dp", ...). Split() sets it for children.
  std::string group_name = "world";
  // The flight recorder (comm/flight/recorder.h; always on): how many of
  // its last operations each communicator keeps, and the folder where each
  // rank writes them on a timeout, an abort or SIGUSR1 ("": never written;
  // --flight-recorder-dir, --flight-recorder-entries). Split() children
  // inherit both.
  int flight_recorder_entries = 2048;
  std::string flight_recorder_dir;
};

// A handle on one asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Non-blocking: true once the operation has finished (ok or not).
  virtual bool Poll() = 0;
  // Blocks until finished or `timeout` passed. Returns the op's status, or
  // DeadlineExceeded (op, group, seq, missing ranks) if still running.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Waits up to the communicator's CommOptions::timeout (plus a little slack,
  // so the op's own DeadlineExceeded with missing ranks wins).
  virtual absl::Status Wait() = 0;
  // Where later work runs: makes the work the caller issues next on its
  // device stream wait for this operation, without blocking the host (a
  // device communicator), or is Wait() (host-memory backends, where the host
  // is the thing that waits). Returns the errors known so far. A device
  // operation that then fails or outlives CommOptions::timeout is failed by
  // the backend's watchdog, which aborts the communicator: the next
  // operation on it fails with FailedPrecondition naming that error. The
  // op's tensors stay alive until it completes. This is the hot-path wait
  // of layers, pipeline and optimizer; Wait() is for the host's own reads.
  virtual absl::Status WaitOnStream() { return Wait(); }
  // "all_reduce #12 in group 'tp'"
  virtual std::string Describe() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// A Work that is already finished (used for argument errors and no-ops).
WorkPtr CompletedWork(absl::Status status, std::string description);

// Waits for every handle; returns the first error.
absl::Status WaitAll(const std::vector<WorkPtr>& works);
// WaitOnStream for every handle; returns the first error.
absl::Status WaitAllOnStream(const std::vector<WorkPtr>& works);

// One leg of a batched send/recv (BatchSendRecv).
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  core::Tensor tensor;
  int peer = 0;  // rank in this communicator
  int tag = 0;   // 0 <= tag < kMaxTag
};
constexpr int kMaxTag = 1 << 19;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual core::Device device() const = 0;
  virtual const std::string& group_name() const = 0;
  virtual const char* backend_name() const = 0;

  // output[i] = op over ranks of input[i]. Same shape/dtype everywhere.
  virtual WorkPtr AllReduce(const core::Tensor& input, const core::Tensor& output,
                            ReduceOp op) = 0;
  // output = root's input on every rank (input only read at root).
  virtual WorkPtr Broadcast(const core::Tensor& input, const core::Tensor& output,
                            int root) = 0;
  // Like AllReduce but only root's output is written.
  virtual WorkPtr Reduce(const core::Tensor& input, const core::Tensor& output,
                         ReduceOp op, int root) = 0;
  // output (numel = size * n) = concat over ranks of input (numel n).
  virtual WorkPtr AllGather(const core::Tensor& input, const core::Tensor& output) = 0;
  // input (numel = size * n): output (numel n) = op over ranks of input's
  // block `rank`.
  virtual WorkPtr ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                                ReduceOp op) = 0;
  // input and output numel = size * n: output block j = input block `rank`
  // of rank j.
  virtual WorkPtr AllToAll(const core::Tensor& input, const core::Tensor& output) = 0;
  // All-to-all with per-peer counts (MPI_Alltoallv over packed blocks; the
  // token exchange of mixture-of-experts layers). `send_counts` and
  // `recv_counts` have size() entries, each >= 0; input holds, in rank order,
  // send_counts[j] elements for rank j (numel = their sum) and output gets,
  // in rank order, recv_counts[j] elements from rank j (numel = their sum).
  // recv_counts[j] here must equal send_counts[rank] on rank j (exchange the
  // counts first, e.g. with AllToAll): a mismatch is an InvalidArgument from
  // the receiver on local and ucx, MPI's truncation error or undefined on
  // mpi, undetected on nccl. Zero counts are allowed (to some or all peers).
  // No in-place form: input and output must not overlap. Bad arguments
  // (counts of the wrong length or negative, a tensor whose numel is not
  // its counts' sum) are InvalidArgument errors naming the argument, like
  // every op's.
  virtual WorkPtr AllToAllV(const core::Tensor& input, const std::vector<int64_t>& send_counts,
                            const core::Tensor& output, const std::vector<int64_t>& recv_counts) = 0;
  // Point to point (see POINT TO POINT above): one message to or from `peer`.
  virtual WorkPtr Send(const core::Tensor& tensor, int peer, int tag = 0) = 0;
  virtual WorkPtr Recv(const core::Tensor& tensor, int peer, int tag = 0) = 0;
  // Posts all sends and receives at once (a 1F1B stage that sends and receives
  // in the same step cannot deadlock); one handle for all, complete when
  // every leg is.
  virtual WorkPtr BatchSendRecv(const std::vector<P2POp>& ops) = 0;
  virtual WorkPtr Barrier() = 0;
  // A barrier whose own limit is `op_timeout` instead of CommOptions::timeout,
  // for waiting on a rank that is busy on purpose (rank 0 preparing a
  // dataset). Wait() on its handle waits that long (plus slack).
  virtual WorkPtr BarrierWithin(absl::Duration op_timeout) = 0;

  // Collective over this communicator (blocking): ranks with the same color
  // form a new group, ordered by (key, old rank). color < 0: this rank joins
  // no group and gets nullptr. `name` labels the child in error messages.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                               const std::string& name) = 0;

  // Convenience: in-place forms.
  WorkPtr AllReduce(const core::Tensor& inout, ReduceOp op) { return AllReduce(inout, inout, op); }
  WorkPtr Broadcast(const core::Tensor& inout, int root) { return Broadcast(inout, inout, root); }
};

// Blocking all-reduce of one double (loss averages, gradient norms). A null
// communicator or one of size 1 leaves *value as it is.
absl::Status AllReduceScalar(Communicator* c, ReduceOp op, double* value);

// Blocking all-gather of host tensors on any backend: a device backend (NCCL)
// gets device copies, and the result is copied back into `out` (host). For
// small control data (lengths, names, statuses), not for the hot path.
absl::Status AllGatherHost(Communicator* c, const core::Tensor& in, const core::Tensor& out);

}  // namespace loom::comm

#endif  // LOOM_COMM_COMM_H_
