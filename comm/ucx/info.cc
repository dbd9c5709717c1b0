// What Loom knows about the `ucx` backend (comm/backend_registry.h).
#include "comm/backend_registry.h"

namespace loom::comm::ucx {
namespace {

BackendInfo Info() {
  BackendInfo b;
  b.name = "ucx";
  b.device = BackendDevice::kHost;
  b.needs_store = true;  // worker addresses are exchanged through it
  b.launched_by = LaunchedBy::kProcesses;
  // UCX 1.13 transports.
  b.network = {{"ethernet", {{"UCX_TLS", "sm,self,tcp"}}},
               {"infiniband", {{"UCX_TLS", "rc,ud,sm,self"}}}};
  return b;
}

const BackendRegistrar registrar(Info());

}  // namespace
}  // namespace loom::comm::ucx
