#ifndef LOOM_COMM_BACKENDS_H_
#define LOOM_COMM_BACKENDS_H_

// The backend factory: binaries select a backend by name (--backend). Links
// every backend available on this machine (MPI, UCX, NCCL when installed);
// what each one is and how it is created is in the registry
// (backend_registry.h), filled from the backends' folders.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/backend_registry.h"
#include "comm/comm.h"
#include "comm/launch/flags.h"
#include "comm/store/store.h"

namespace loom::comm {

// A registered backend's name ("local", "mpi", "ucx", "nccl"). Unknown or
// not-built names are InvalidArgument / Unimplemented errors listing
// AvailableBackends().
absl::StatusOr<std::unique_ptr<Communicator>> Create(const std::string& backend,
                                                     const BackendOptions& options);
std::vector<std::string> AvailableBackends();  // BuiltBackends(): sorted

// OK iff `backend` is a backend name and was built into this binary. Errors
// name `flag` (as the user typed it, e.g. "--distributed-backend") and list
// the built backends. For checking before any rank starts.
absl::Status CheckBackend(const std::string& backend, const std::string& flag = "--backend");

// Every check CreateFromFlags would make of `flags` without starting
// anything: the backend (named as `backend_flag`), --network, --store,
// --comm-timeout-s. A launcher calls it before it starts any rank.
absl::Status CheckCommFlags(const launch::CommFlags& flags,
                            const std::string& backend_flag = "--backend");

// For multi-process binaries (mpi, ucx, nccl): discovers the rank (flags, then
// environment), opens the store named by --store (rank 0 serves TCP; a world
// of one rank needs no port and gets an in-process store), applies --network
// and creates the world communicator. `store_out` (optional) receives the
// store. Not for `local` (its ranks are threads).
absl::StatusOr<std::unique_ptr<Communicator>> CreateFromFlags(
    const launch::CommFlags& flags, std::shared_ptr<Store>* store_out = nullptr);
// The same for a rank already discovered (launch::PlanLaunch's plan.rank).
absl::StatusOr<std::unique_ptr<Communicator>> CreateFromFlags(
    const launch::CommFlags& flags, const launch::RankInfo& rank,
    std::shared_ptr<Store>* store_out = nullptr);

}  // namespace loom::comm

#endif  // LOOM_COMM_BACKENDS_H_
