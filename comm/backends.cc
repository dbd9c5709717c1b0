#include "comm/backends.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "comm/launch/discovery.h"
#include "comm/launch/network.h"
#include "comm/launch/torchrun.h"
#include "comm/store/file_store.h"
#include "comm/store/memory_store.h"
#include "comm/store/tcp_store.h"
namespace loom::comm {
namespace {

absl::Status CheckStore(const std::string& store) {
  if (store == "tcp" || (absl::StartsWith(store, "file:") && store.size() > 5)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--store='", store, "' is not 'tcp' or 'file:<shared directory>'"));
}

}  // namespace

std::vector<std::string> AvailableBackends() { return BuiltBackends(); }

absl::Status CheckBackend(const std::string& backend, const std::string& flag) {
  return LookupBuiltBackend(backend, flag).status();
}

absl::Status CheckCommFlags(const launch::CommFlags& flags, const std::string& backend_flag) {
  absl::Status s = CheckBackend(flags.backend, backend_flag);
  if (!s.ok()) return s;
  s = launch::NetworkSettings(flags.network, flags.backend).status();
  if (!s.ok()) return s;
  s = CheckStore(flags.store);
  if (!s.ok()) return s;
  if (!(flags.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--comm-timeout-s=", flags.timeout_s, " must be > 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> Create(const std::string& backend,
                                                     const BackendOptions& o) {
  absl::Status s = CheckBackend(backend);
  if (!s.ok()) return s;
  s = launch::ApplyNetworkSettings(o.network, backend);
  if (!s.ok()) return s;
  return (*FindFactory(backend))(o);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateFromFlags(const launch::CommFlags& flags,
                                                              std::shared_ptr<Store>* store_out) {
  const BackendInfo* backend = FindBackend(flags.backend);
  if (backend == nullptr || backend->launched_by != LaunchedBy::kProcesses) {
    // Threads refuse below; MPI knows the rank; an unknown name fails in Create.
    return CreateFromFlags(flags, launch::RankInfo{}, store_out);
  }
  absl::StatusOr<launch::RankInfo> info = launch::DiscoverRank(flags.rank);
  if (!info.ok()) return info.status();
  return CreateFromFlags(flags, *info, store_out);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateFromFlags(const launch::CommFlags& flags,
                                                              const launch::RankInfo& info,
                                                              std::shared_ptr<Store>* store_out) {
  BackendOptions o;
  o.network = flags.network;
  o.comm.timeout = absl::Seconds(flags.timeout_s);
  o.comm.flight_recorder_dir = flags.flight_recorder_dir;
  o.comm.flight_recorder_entries = flags.flight_recorder_entries;
  absl::StatusOr<const BackendInfo*> backend = LookupBuiltBackend(flags.backend);
  if (!backend.ok()) return backend.status();
  if ((*backend)->launched_by == LaunchedBy::kThreads) {
    std::vector<std::string> processes;
    for (const std::string& name : BuiltBackends()) {
      if (FindBackend(name)->launched_by != LaunchedBy::kThreads) {
        processes.push_back(absl::StrCat("--backend=", name));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=", flags.backend, " runs ranks as threads of one process; multi-process "
        "binaries need ", absl::StrJoin(processes, ", ")));
  }
  if (!(*backend)->needs_store) return Create(flags.backend, o);  // mpi: MPI knows the rank
  o.rank = info.rank;
  o.world_size = info.world_size;
  o.local_rank = info.local_rank;
  if (flags.store == "tcp" && info.world_size == 1) {
    o.store = std::make_shared<MemoryStore>();  // nobody to meet: no port to bind
  } else if (flags.store == "tcp") {
    TcpStoreOptions to;
    to.host = info.master_addr;  // rank 0 binds this address, not every interface
    to.port = info.master_port;
    to.is_server = info.rank == 0;
    to.secret = flags.rendezvous_secret;  // --rendezvous-secret / LOOM_RENDEZVOUS_SECRET
    to.connect_timeout = o.comm.timeout;
    // Under torchrun its agent owns MASTER_PORT: meet through its store.
    auto st = info.torchrun_agent_store ? launch::MeetThroughTorchrun(info, to)
                                        : TcpStore::Create(to);
    if (!st.ok()) return st.status();
    o.store = std::move(*st);
  } else if (absl::Status s = CheckStore(flags.store); !s.ok()) {
    return s;
  } else {  // file:<dir>
    auto st = FileStore::Open(flags.store.substr(5));
    if (!st.ok()) return st.status();
    o.store = std::move(*st);
  }
  if (store_out) *store_out = o.store;
  return Create(flags.backend, o);
}

}  // namespace loom::comm
