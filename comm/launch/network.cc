#include "comm/launch/network.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace loom::comm::launch {

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> NetworkSettings(
    const std::string& network, const std::string& backend, bool single_node) {
  if (network != "auto" && network != "ethernet" && network != "infiniband") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--network='", network, "' is not one of auto, ethernet, infiniband"));
  }
  if (backend != "local" && backend != "mpi" && backend != "ucx") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend='", backend, "' is not one of local, mpi, ucx"));
  }
  std::vector<std::pair<std::string, std::string>> out;
  if (backend == "local") return out;
  if (network == "auto") {
    // Every rank on this node: shared memory only. UCX's default also opens
    // TCP, and then every progress call polls it (2.8x MPI's small-message
    // latency here, 1.7x without it; comm/BENCH_RESULTS.txt).
    if (backend == "ucx" && single_node) out.push_back({"UCX_TLS", "sm,self"});
    return out;
  }
  if (backend == "ucx") {
    out.push_back({"UCX_TLS", network == "ethernet" ? "sm,self,tcp" : "rc,ud,sm,self"});
  } else {  // mpi
    if (network == "ethernet") {
      out.push_back({"OMPI_MCA_pml", "ob1"});
      out.push_back({"OMPI_MCA_btl", "tcp,self,vader"});
    } else {
      out.push_back({"OMPI_MCA_pml", "ucx"});
    }
  }
  return out;
}

absl::Status ApplyNetworkSettings(const std::string& network, const std::string& backend,
                                  bool single_node) {
  auto settings = NetworkSettings(network, backend, single_node);
  if (!settings.ok()) return settings.status();
  for (const auto& [k, v] : *settings) setenv(k.c_str(), v.c_str(), /*overwrite=*/0);
  return absl::OkStatus();
}

}  // namespace loom::comm::launch
