// What Loom knows about the `local` backend (comm/backend_registry.h).
#include "comm/backend_registry.h"

namespace loom::comm::local {
namespace {

BackendInfo Info() {
  BackendInfo b;
  b.name = "local";
  b.device = BackendDevice::kHost;
  b.needs_store = true;  // a MemoryStore shared by the threads
  b.launched_by = LaunchedBy::kThreads;
  // No network: the threads share memory.
  return b;
}

const BackendRegistrar registrar(Info());

}  // namespace
}  // namespace loom::comm::local
