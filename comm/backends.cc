#include "comm/backends.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "comm/launch/discovery.h"
#include "comm/launch/network.h"
#include "comm/launch/torchrun.h"
#include "comm/local/communicator.h"
#include "comm/store/file_store.h"
#include "comm/store/memory_store.h"
#include "comm/store/tcp_store.h"
#ifdef LOOM_COMM_HAVE_MPI
#include "comm/mpi/communicator.h"
#endif
#ifdef LOOM_COMM_HAVE_UCX
#include "comm/ucx/communicator.h"
#endif
#ifdef LOOM_COMM_HAVE_NCCL
#include "comm/nccl/communicator.h"
#endif

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

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> out = {"local"};
#ifdef LOOM_COMM_HAVE_MPI
  out.push_back("mpi");
#endif
#ifdef LOOM_COMM_HAVE_UCX
  out.push_back("ucx");
#endif
#ifdef LOOM_COMM_HAVE_NCCL
  out.push_back("nccl");
#endif
  return out;
}

absl::Status CheckBackend(const std::string& backend, const std::string& flag) {
  std::vector<std::string> avail = AvailableBackends();
  if (backend != "local" && backend != "mpi" && backend != "ucx" && backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat(flag, "='", backend,
                                                   "' is not a backend; built backends: ",
                                                   absl::StrJoin(avail, ", ")));
  }
  if (std::find(avail.begin(), avail.end(), backend) == avail.end()) {
    return absl::UnimplementedError(absl::StrCat(
        flag, "=", backend, " was not built (its library is missing; see "
        "@loom_deps//:MISSING.txt); built backends: ", absl::StrJoin(avail, ", ")));
  }
  return absl::OkStatus();
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
  if (backend == "local") {
    auto* mem = dynamic_cast<MemoryStore*>(o.store.get());
    if (mem == nullptr) {
      return absl::InvalidArgumentError(
          "backend 'local' runs ranks as threads of one process: pass a MemoryStore shared by "
          "those threads as BackendOptions::store");
    }
    local::LocalOptions lo;
    lo.comm = o.comm;
    return local::Create(o.rank, o.world_size, *mem, lo);
  }
#ifdef LOOM_COMM_HAVE_MPI
  if (backend == "mpi") {
    mpi::MpiOptions mo;
    mo.comm = o.comm;
    return mpi::CreateWorld(mo);
  }
#endif
#ifdef LOOM_COMM_HAVE_UCX
  if (backend == "ucx") {
    if (!o.store) {
      return absl::InvalidArgumentError(
          "backend 'ucx' exchanges worker addresses through a store: set BackendOptions::store");
    }
    ucx::UcxOptions uo;
    uo.comm = o.comm;
    return ucx::Create(o.rank, o.world_size, o.store, uo);
  }
#endif
#ifdef LOOM_COMM_HAVE_NCCL
  if (backend == "nccl") {
    if (!o.store) {
      return absl::InvalidArgumentError(
          "backend 'nccl' publishes NCCL's unique id through a store: set BackendOptions::store");
    }
    nccl::NcclOptions no;
    no.comm = o.comm;
    no.local_rank = o.local_rank;  // the GPU of this rank
    return nccl::Create(o.rank, o.world_size, o.store, no);
  }
#endif
  return absl::InternalError("unreachable");
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateFromFlags(const launch::CommFlags& flags,
                                                              std::shared_ptr<Store>* store_out) {
  if (flags.backend == "local" || flags.backend == "mpi") {
    return CreateFromFlags(flags, launch::RankInfo{}, store_out);  // neither needs a rank
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
  if (flags.backend == "local") {
    return absl::InvalidArgumentError(
        "--backend=local runs ranks as threads of one process; multi-process binaries need "
        "--backend=mpi, --backend=ucx or --backend=nccl");
  }
  if (flags.backend == "mpi") return Create("mpi", o);
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
