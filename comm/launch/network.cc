#include "comm/launch/network.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace loom::comm::launch {

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> NetworkSettings(
    const std::string& network, const std::string& backend) {
  if (network != "auto" && network != "ethernet" && network != "infiniband") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--network='", network, "' is not one of auto, ethernet, infiniband"));
  }
  if (backend != "local" && backend != "mpi" && backend != "ucx" && backend != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend='", backend, "' is not one of local, mpi, ucx, nccl"));
  }
  std::vector<std::pair<std::string, std::string>> out;
  if (network == "auto" || backend == "local") return out;
  if (backend == "nccl") {
    // NCCL_NET picks NCCL's transport by name, so "infiniband" fails at init
    // when there is no IB instead of silently falling back to sockets (like
    // UCX_TLS=rc,... for ucx). No interface is named: like the other backends
    // we leave NCCL_SOCKET_IFNAME to NCCL's choice or the user.
    if (network == "ethernet") {
      out.push_back({"NCCL_IB_DISABLE", "1"});
      out.push_back({"NCCL_NET", "Socket"});
    } else {
      out.push_back({"NCCL_IB_DISABLE", "0"});
      out.push_back({"NCCL_NET", "IB"});
    }
  } else if (backend == "ucx") {
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

absl::Status ApplyNetworkSettings(const std::string& network, const std::string& backend) {
  auto settings = NetworkSettings(network, backend);
  if (!settings.ok()) return settings.status();
  for (const auto& [k, v] : *settings) setenv(k.c_str(), v.c_str(), /*overwrite=*/0);
  return absl::OkStatus();
}

}  // namespace loom::comm::launch
