#ifndef LOOM_COMM_NCCL_COMMUNICATOR_H_
#define LOOM_COMM_NCCL_COMMUNICATOR_H_

// The `nccl` backend: every op is one NCCL call (or one NCCL group) on GPU
// memory of this communicator's CUDA device.
//
// Bootstrap: rank 0 calls ncclGetUniqueId and publishes it in the rendezvous
// Store under "nccl/<group>/gen<g>/unique_id" (g counts the communicators of
// that group name this process created, so re-creating a group never reads a
// stale id); the others Get it within CommOptions::timeout. Communicators are
// non-blocking (ncclConfig_t::blocking = 0), so an init or split that does
// not complete in time is aborted and reported (DeadlineExceeded), never a
// hang. Device: NcclOptions::device, else the local rank mod the visible GPUs. Split uses
// ncclCommSplit (color < 0 -> NCCL_SPLIT_NOCOLOR -> nullptr).
//
// Streams: each communicator owns a non-blocking CUDA stream. An op records
// an event on the calling thread's compute stream for the communicator's
// device (core::cuda::CurrentStream), makes the NCCL stream wait on it (so
// the op sees every kernel queued before it), enqueues the NCCL call and
// records a completion event. Work::Poll = cudaEventQuery (plus
// ncclCommGetAsyncError); Work::Wait polls until done, then makes the compute
// stream wait on the completion event (for the host's own reads).
// Work::WaitOnStream — the hot-path wait of layers, pipeline and optimizer —
// only makes the compute stream wait on the completion event and hands the op
// to the communicator's watchdog thread: the host never blocks on it.
//
// Watchdog: an op not complete CommOptions::timeout after it was issued is
// failed with DeadlineExceeded naming op, group and sequence number — by
// Poll/Wait, or by the watchdog thread for ops left to the stream; the
// communicator is aborted (ncclCommAbort: the stuck kernels exit, so a
// compute stream waiting on them drains) and every later op fails fast with
// FailedPrecondition naming the cause. An asynchronous NCCL error
// (ncclCommGetAsyncError, e.g. a dead peer's remote error) aborts it the same
// way. Every check runs under the communicator's mutex, as every enqueue
// does, so they never race; an enqueue or split that waits for a busy
// communicator (NCCL still connecting, up to the op timeout) releases the
// mutex between polls, so the watchdog keeps its period meanwhile. The
// watchdog holds ops left to it (and so their tensors) until they complete.
// An argument error takes the op's sequence number and aborts the
// communicator (comm.h), as on every backend.
//
// Differences from the other backends (documented in comm/README.md):
//  * Cross-rank mismatches (count, dtype, op, root) cannot be detected: NCCL
//    has no message signatures; they hang (then time out) or corrupt data.
//  * Tags are validated but do not route messages: sends and receives between
//    a pair match in issue order (NCCL's rule). A Send may not complete until
//    the peer posts the matching Recv; exchanges in both directions belong in
//    one BatchSendRecv (one NCCL group).
//  * bf16/f16 reductions accumulate in NCCL's way (each step rounds to the
//    dtype), not in f32; kAvg is ncclAvg (floating: pre-multiplied by 1/n;
//    integers: truncating division of the sum, as the contract says).
//  * Ranks that did not arrive cannot be named (NCCL does not report them).
//  * An op's timeout counts from when it is issued, not from when the GPU
//    starts it: with WaitOnStream the host runs ahead of the GPU by up to a
//    step (the step ends with a host read of the loss), so CommOptions::timeout
//    must be longer than a step.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "comm/store/store.h"

namespace loom::comm::nccl {

struct NcclOptions {
  CommOptions comm;
  // CUDA device of this rank; -1: local_rank mod the visible GPUs. NCCL refuses two ranks of one
  // communicator on the same GPU.
  int device = -1;
  int local_rank = 0;
  // Store key generation; -1: this process's count of communicators created
  // with this group name (the same on every rank that creates them in the
  // same order).
  int64_t generation = -1;
};

// Rank `rank` of `size` processes (one GPU each); every rank calls it with a
// store they share. Blocks until NCCL is initialised or the timeout passes.
absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, int size,
                                                     std::shared_ptr<Store> store,
                                                     const NcclOptions& options = {});

// "2.28.9" for the NCCL linked in (works without a GPU).
std::string LinkedNcclVersion();

}  // namespace loom::comm::nccl

#endif  // LOOM_COMM_NCCL_COMMUNICATOR_H_
