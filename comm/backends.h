#ifndef LOOM_COMM_BACKENDS_H_
#define LOOM_COMM_BACKENDS_H_

// The backend factory: binaries select a backend by name (--backend). Links
// every backend available on this machine (MPI, UCX, NCCL when installed).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "comm/launch/flags.h"
#include "comm/store/store.h"

namespace loom::comm {

struct BackendOptions {
  int rank = 0;        // ignored by mpi (MPI knows)
  int world_size = 1;  // ignored by mpi
  int local_rank = 0;   // nccl: the GPU this rank uses
  // Rendezvous: local needs a MemoryStore shared by its threads; ucx needs
  // (and nccl) any store reachable by all ranks; mpi needs none.
  std::shared_ptr<Store> store;
  CommOptions comm;
  std::string network = "auto";  // see comm/launch/network.h
};

// "local", "mpi", "ucx" or "nccl". Unknown or not-built names are InvalidArgument /
// Unimplemented errors listing AvailableBackends().
absl::StatusOr<std::unique_ptr<Communicator>> Create(const std::string& backend,
                                                     const BackendOptions& options);
std::vector<std::string> AvailableBackends();

// For multi-process binaries (mpi, ucx, nccl): discovers the rank (flags, then
// environment), opens the store named by --store (rank 0 serves TCP), applies
// --network and creates the world communicator. `store_out` (optional)
// receives the store. Not for `local` (its ranks are threads).
absl::StatusOr<std::unique_ptr<Communicator>> CreateFromFlags(
    const launch::CommFlags& flags, std::shared_ptr<Store>* store_out = nullptr);

}  // namespace loom::comm

#endif  // LOOM_COMM_BACKENDS_H_
