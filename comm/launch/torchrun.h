#ifndef LOOM_COMM_LAUNCH_TORCHRUN_H_
#define LOOM_COMM_LAUNCH_TORCHRUN_H_

// Ranks started by torchrun meet without taking torchrun's port.
//
// torchrun's agent serves PyTorch's TCPStore on MASTER_ADDR:MASTER_PORT
// before it starts its workers (TORCHELASTIC_USE_AGENT_STORE=True), so rank 0
// cannot listen there. Loom does not move its rendezvous into that store: it
// has no authentication, and Loom's store carries what a job must not take
// from strangers (UCX worker addresses, NCCL's unique id). Instead:
//
//   rank 0  counts its starts in torchrun's store (ADD loom/<run>/rank0_starts:
//           the world's start number, 0 first), starts Loom's store (auth.h:
//           every connection proves the job's secret, both ways) on a free
//           port of the address it reaches torchrun's store by, writes the
//           start number into it, and announces "<start> <host>:<port>" under
//           loom/<TORCHELASTIC_RUN_ID>/store in torchrun's store;
//   others  read the announcement and connect with the secret, reading it
//           again while the address does not answer (a restarted job may
//           still list the store of the start before, whose rank 0 is gone:
//           torchrun stops every worker before it starts the next ones);
//           the start number comes from Loom's store, not the announcement.
//
// The start number is the world's restart count (launcher.h's RestartCount:
// a restarted job resumes from --save). TORCHELASTIC_RESTART_COUNT cannot be:
// with --rdzv-backend=c10d each node's agent counts only its own workers'
// failures, so after one rank dies its node says 1 and every other node 0.
// It is logged. Restarts across hosts need c10d: with static rendezvous an
// agent does not hear of another node's failure.
//
// Someone who can reach torchrun's port can overwrite the announcement: the
// ranks then fail the handshake with PermissionDenied (an impostor cannot
// prove the secret) rather than join a stranger's world.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/launch/discovery.h"
#include "comm/store/tcp_store.h"

namespace loom::comm::launch {

// Keys in torchrun's store.
std::string TorchrunAnnounceKey(const RankInfo& info);
std::string TorchrunStartsKey(const RankInfo& info);
// The key in Loom's store that holds the world's start number.
inline constexpr char kTorchrunStartKey[] = "loom/torchrun/start";

// Meets as above; `options` gives the secret and the timeouts (host, port and
// is_server are set here); options.connect_timeout bounds the whole meeting.
// Requires info.torchrun_agent_store. Sets RestartCount() to the world's
// start number. Rank 0 logs one line to stderr saying where its store is.
absl::StatusOr<std::unique_ptr<TcpStore>> MeetThroughTorchrun(const RankInfo& info,
                                                              TcpStoreOptions options);

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_TORCHRUN_H_
