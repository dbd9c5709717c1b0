#ifndef LOOM_COMM_BACKEND_REGISTRY_H_
#define LOOM_COMM_BACKEND_REGISTRY_H_

// The backend registry: what Loom knows about each collective backend, asked
// by name instead of lists of names spread over the launcher, the network
// mapping, the trainer's config checks and the conformance main.
//
// A backend registers in two parts, both in its own folder (comm/<name>/):
//   info.cc          BackendRegistrar: name, device, store, who starts the
//                    ranks, --network table, what the conformance suite
//                    expects. Pure data, no library: linked wherever a
//                    backend name is checked (//comm:known_backends), so
//                    //plan and Finalize accept "nccl" on a CPU-only machine.
//   registration.cc  FactoryRegistrar: the function creating the world
//                    communicator. Links the backend's library, so it is
//                    linked only where that library was found (if_available
//                    in //comm:backends).
// Both are alwayslink cc_library targets: a static registrar object per
// backend keeps each backend's facts in its folder and lets Bazel's
// requires()/if_available decide what is built; a generated list of explicit
// calls would be one more central file to edit per backend.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"
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

using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<Communicator>>(const BackendOptions&)>;

// Where a backend's tensors live.
enum class BackendDevice { kHost, kCuda };

// Who starts a backend's ranks (comm/launch/plan.h decides by this).
enum class LaunchedBy {
  kThreads,    // threads of one process, meeting in a MemoryStore (local)
  kProcesses,  // one process per rank: Loom's agent (--nproc-per-node) or
               // an external launcher (torchrun, srun, a script)
  kMpirun,     // mpirun or srun: MPI connects the ranks, nobody else can
};

// --network's value ("ethernet", "infiniband") -> the environment variables
// set before the backend starts. "auto" and absent values set nothing.
using NetworkTable = std::map<std::string, std::vector<std::pair<std::string, std::string>>>;

// What the conformance suite (comm/testing) may expect of the backend.
struct ConformanceTraits {
  bool detects_mismatch = true;  // ranks that issue different ops get errors
  bool names_missing_ranks = true;  // a timeout names the ranks that never came
  // One world per process: creating a second is FailedPrecondition, and a
  // world broken by a failed op cannot be torn down (exit without it).
  bool one_world_per_process = false;
};

struct BackendInfo {
  std::string name;
  BackendDevice device = BackendDevice::kHost;
  bool needs_store = false;  // rendezvous through BackendOptions::store
  LaunchedBy launched_by = LaunchedBy::kProcesses;
  NetworkTable network;
  ConformanceTraits conformance;
};

// Static registration (one object per backend, at namespace scope in its
// folder's info.cc / registration.cc). A second registration of a name, or a
// factory for a name without info, aborts at start-up: a build error in all
// but name.
class BackendRegistrar {
 public:
  explicit BackendRegistrar(BackendInfo info);
};
class FactoryRegistrar {
 public:
  FactoryRegistrar(const std::string& name, BackendFactory factory);
};

// Backends this binary knows (their info is linked): nullptr if none is `name`.
const BackendInfo* FindBackend(const std::string& name);
// `name`'s factory, or nullptr where it was not built into this binary.
const BackendFactory* FindFactory(const std::string& name);
// Names, sorted: known to this binary, and built into it (a factory linked).
std::vector<std::string> KnownBackends();
std::vector<std::string> BuiltBackends();

// FindBackend, or InvalidArgument "<flag>='foo' is not one of the built
// backends: local, mpi, ..." (naming known backends not built here).
absl::StatusOr<const BackendInfo*> LookupBackend(const std::string& name,
                                                 const std::string& flag = "--backend");
// LookupBackend, then Unimplemented where `name` was not built here (its
// library is missing), listing the built ones.
absl::StatusOr<const BackendInfo*> LookupBuiltBackend(const std::string& name,
                                                      const std::string& flag = "--backend");

// The names of the backends whose device is `device`, sorted, for messages.
std::vector<std::string> BackendsOn(BackendDevice device);

}  // namespace loom::comm

#endif  // LOOM_COMM_BACKEND_REGISTRY_H_
