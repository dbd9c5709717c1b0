#include "comm/launch/network.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "comm/backend_registry.h"

namespace loom::comm::launch {

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> NetworkSettings(
    const std::string& network, const std::string& backend) {
  if (network != "auto" && network != "ethernet" && network != "infiniband") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--network='", network, "' is not one of auto, ethernet, infiniband"));
  }
  absl::StatusOr<const BackendInfo*> info = LookupBackend(backend);
  if (!info.ok()) return info.status();
  // Each backend's own table (comm/<backend>/info.cc); "auto" sets nothing.
  auto it = (*info)->network.find(network);
  if (network == "auto" || it == (*info)->network.end()) {
    return std::vector<std::pair<std::string, std::string>>{};
  }
  return it->second;
}

absl::Status ApplyNetworkSettings(const std::string& network, const std::string& backend) {
  auto settings = NetworkSettings(network, backend);
  if (!settings.ok()) return settings.status();
  for (const auto& [k, v] : *settings) setenv(k.c_str(), v.c_str(), /*overwrite=*/0);
  return absl::OkStatus();
}

}  // namespace loom::comm::launch
