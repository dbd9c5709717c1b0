#include "comm/launch/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/launch/agent.h"
#include "comm/launch/discovery.h"
#include "comm/launch/plan.h"
#include "comm/store/auth.h"
#include "comm/store/memory_store.h"
#include "comm/store/tcp_store.h"

namespace loom::comm::launch {

bool IsLaunchedChild() {
  const char* v = std::getenv("LOOM_LAUNCHED");
  return v != nullptr && std::string(v) == "1";
}

namespace {
std::atomic<int> restart_count_override{-1};
}  // namespace

void SetRestartCount(int n) { restart_count_override = n; }

int RestartCount() {
  if (const int n = restart_count_override; n >= 0) return n;
  // Discovery reads the launchers' counts (RankInfo::restart_count).
  const absl::StatusOr<RankInfo> info = DiscoverRank({}, RealEnv());
  return info.ok() ? info->restart_count : 0;
}

absl::StatusOr<int> PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("picking a free port: ", std::strerror(errno)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

absl::Status LaunchAndWait(const LaunchOptions& o, int argc, char** argv) {
  const int n = o.nproc_per_node;
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc-per-node=", n, " must be >= 1"));
  }
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat("--node-rank=", o.node_rank,
                                                   " must be in [0, --nnodes=", o.nnodes, ")"));
  }
  // A rank started by someone else never starts ranks of its own (see plan.h).
  if (IsLaunchedChild()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--nproc-per-node=", n, ": this process is already a rank started by --nproc-per-node"));
  }
  if (std::vector<std::string> ext = ExternalRankSettings({}, RealEnv()); !ext.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--nproc-per-node=", n, " would start ", n, " ranks here, but this process is already "
        "one rank of a job started by someone else (", absl::StrJoin(ext, ", "),
        "): its launcher (torchrun, mpirun, srun) starts the ranks. Drop --nproc-per-node, or "
        "unset those variables"));
  }
  AgentOptions ao;
  ao.nnodes = o.nnodes;
  ao.node_rank = o.node_rank;
  ao.nproc_per_node = n;
  ao.ranks_as_threads = o.ranks_as_threads;
  ao.master_addr = o.master_addr;
  ao.max_restarts = o.max_restarts;
  ao.heartbeat_timeout = o.heartbeat_timeout;
  ao.kill_grace = o.kill_grace;
  ao.signal_grace = o.signal_grace;
  ao.timeout = o.timeout;
  ao.dump_flight_recorder = o.dump_flight_recorder;
  ao.secret = o.secret;
  if (ao.secret.empty()) {
    if (o.nnodes > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nnodes=", o.nnodes, " needs the job's secret, the same on every node: "
          "--rendezvous-secret=S or LOOM_RENDEZVOUS_SECRET=S (make one with "
          "`openssl rand -hex 32`)"));
    }
    absl::StatusOr<std::string> secret = MakeRendezvousSecret();
    if (!secret.ok()) return secret.status();
    ao.secret = *secret;
  }
  // The ranks find rank 0 in MASTER_ADDR/MASTER_PORT (the agent chooses the
  // port); a --master-addr/--master-port in argv would override those.
  const std::vector<std::string> args =
      WithoutFlags(std::vector<std::string>(argv, argv + argc), {"master_addr", "master_port"});
  if (o.nnodes == 1) {
    ao.rank_port = o.master_port;
    MemoryStore store;
    return RunAgent(ao, store, "this process", args);
  }
  TcpStoreOptions to;
  to.host = o.master_addr;
  to.port = o.master_port;
  to.is_server = o.node_rank == 0;
  to.connect_timeout = o.timeout;
  to.reply_timeout = o.timeout;
  to.secret = ao.secret;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(to);
  if (!store.ok()) {
    return absl::UnavailableError(absl::StrCat("the agents' store (--master-addr=", o.master_addr,
                                               " --master-port=", o.master_port,
                                               "): ", store.status().message()));
  }
  return RunAgent(ao, **store, absl::StrCat(o.master_addr, ":", o.master_port), args);
}

}  // namespace loom::comm::launch
