// What Loom knows about the `nccl` backend (comm/backend_registry.h).
#include "comm/backend_registry.h"

namespace loom::comm::nccl {
namespace {

BackendInfo Info() {
  BackendInfo b;
  b.name = "nccl";
  b.device = BackendDevice::kCuda;
  b.needs_store = true;  // NCCL's unique id is published through it
  b.launched_by = LaunchedBy::kProcesses;
  // NCCL_NET picks NCCL's transport by name, so "infiniband" fails at init
  // when there is no IB instead of silently falling back to sockets (like
  // UCX_TLS=rc,... for ucx). No interface is named: like the other backends
  // we leave NCCL_SOCKET_IFNAME to NCCL's choice or the user.
  b.network = {{"ethernet", {{"NCCL_IB_DISABLE", "1"}, {"NCCL_NET", "Socket"}}},
               {"infiniband", {{"NCCL_IB_DISABLE", "0"}, {"NCCL_NET", "IB"}}}};
  // Mismatched ops are undetectable and missing ranks cannot be named (see
  // nccl/communicator.h); its own conformance main runs the suite.
  b.conformance.detects_mismatch = false;
  b.conformance.names_missing_ranks = false;
  return b;
}

const BackendRegistrar registrar(Info());

}  // namespace
}  // namespace loom::comm::nccl
