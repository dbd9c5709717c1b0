#ifndef LOOM_COMM_LAUNCH_NETWORK_H_
#define LOOM_COMM_LAUNCH_NETWORK_H_

// `--network=auto|ethernet|infiniband` mapped to each backend's own settings
// (environment variables read when the backend initialises). Each backend
// registers its table (BackendInfo::network, comm/<backend>/info.cc); the
// table of all of them is in comm/README.md. E.g.
//   ucx: ethernet -> UCX_TLS=sm,self,tcp   infiniband -> UCX_TLS=rc,ud,sm,self
//   auto: nothing is set; the libraries' own defaults and the user's
//         UCX_TLS / OMPI_MCA_* / NCCL_* apply.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::comm::launch {

// The (variable, value) pairs for `network` and `backend` (a name the
// backend registry knows). An unknown network or backend is an
// InvalidArgument naming --network / --backend and the accepted values.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> NetworkSettings(
    const std::string& network, const std::string& backend);

// Sets them in this process's environment (before the backend starts).
// A variable the user already set is left alone (theirs wins).
absl::Status ApplyNetworkSettings(const std::string& network, const std::string& backend);

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_NETWORK_H_
