// The `local` backend's factory (comm/backend_registry.h).
#include "comm/backend_registry.h"
#include "comm/local/communicator.h"
#include "comm/store/memory_store.h"

namespace loom::comm::local {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> CreateLocal(const BackendOptions& o) {
  auto* mem = dynamic_cast<MemoryStore*>(o.store.get());
  if (mem == nullptr) {
    return absl::InvalidArgumentError(
        "backend 'local' runs ranks as threads of one process: pass a MemoryStore shared by "
        "those threads as BackendOptions::store");
  }
  LocalOptions lo;
  lo.comm = o.comm;
  return Create(o.rank, o.world_size, *mem, lo);
}

const FactoryRegistrar registrar("local", CreateLocal);

}  // namespace
}  // namespace loom::comm::local
