#ifndef LOOM_COMM_UCX_COMMUNICATOR_H_
#define LOOM_COMM_UCX_COMMUNICATOR_H_

// The `ucx` backend: one UCP worker per process (on a single host, shared
// memory, rendezvous from 128 KiB: see UcxOptions::same_host_tuning), one
// endpoint per peer,
// worker addresses exchanged through the rendezvous Store, and our own
// algorithms (comm/internal/engine.h: ring reduce-scatter + all-gather for
// large all-reduces, recursive doubling for small ones, trees, ...) over UCP
// tag send/recv. Transports follow UCX's own settings (UCX_TLS; see
// --network in comm/README.md); on one host, small messages go through our
// own shared-memory rings instead (same_host_channel_bytes, shm_channel.h). Staging buffers live in
// the communicator and are reused across calls. A peer that dies: the others time out naming it. A
// failed op's buffers stay with the transport while UCX may touch them (comm.h, FAILURE). Store
// keys carry the world's generation (a world re-created over the same store reads no stale
// addresses).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "comm/store/store.h"

namespace loom::comm::ucx {

struct UcxOptions {
  CommOptions comm;
  size_t small_bytes = 64 << 10;  // all-reduce and all-to-all algorithm switch
  // How long to wait for every rank's worker address in the store.
  absl::Duration connect_timeout = absl::Seconds(60);
  // UCP_ERR_HANDLING_MODE_PEER on endpoints (sends to a dead peer fail fast).
  // Off by default: UCX 1.13 then refuses its shared-memory transports
  // ("posix/memory - no peer failure handler") and falls back to TCP, ~20x
  // slower within a node. Timeouts catch dead peers either way.
  bool peer_failure_mode = false;
  // UCX_RNDV_SCHEME applied before UCX reads its configuration, unless the
  // variable is already set ("" leaves UCX's default). put_zcopy measured
  // 5-20x the bandwidth of UCX 1.13's default (get_zcopy) for 256 KiB-4 MiB
  // messages between two processes here (see BENCH_RESULTS.txt).
  std::string rndv_scheme = "put_zcopy";
  // When all ranks share a host and UCX_TLS is unset: shared-memory
  // transports only (no TCP), and the eager protocol below 128 KiB,
  // rendezvous from there (UCX_RNDV_THRESH, unless set; measured in
  // communicator.cc). Off: UCX's own choices everywhere.
  bool same_host_tuning = true;
  // Flow control of eager messages: a sender gets at most about this many
  // bytes (per receiving rank, plus one message) ahead of what the receiver
  // has received. The send that reaches the limit is synchronous (it
  // completes once the receiver took it), so a broadcast root or reduce leaf
  // that runs ahead waits there instead of filling the receiver's
  // unexpected-message memory. (A single Send's op does not wait for its
  // message; only its handle does: the caller bounds those.) 0: no limit.
  size_t max_bytes_ahead = 8 << 20;
  // When every rank is on one host: messages of at most this many bytes go
  // through our own shared-memory rings (one per ordered pair of ranks,
  // comm/ucx/shm_channel.h) instead of UCX, whose shared-memory send
  // contends for the receiver's FIFO head; larger ones stay on UCX.
  // 0: everything on UCX. The environment variable
  // LOOM_UCX_SAME_HOST_CHANNEL_BYTES, when set, overrides it (tests, bench).
  // At most kMaxSameHostChannelBytes.
  size_t same_host_channel_bytes = 1024;
};

inline constexpr size_t kMaxSameHostChannelBytes = 64 << 10;

// Rank `rank` of `size` processes; every rank calls it with the same store.
absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, int size,
                                                     std::shared_ptr<Store> store,
                                                     const UcxOptions& options = {});

}  // namespace loom::comm::ucx

#endif  // LOOM_COMM_UCX_COMMUNICATOR_H_
