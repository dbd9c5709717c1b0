// The `ucx` backend's factory (comm/backend_registry.h).
#include "comm/backend_registry.h"
#include "comm/ucx/communicator.h"

namespace loom::comm::ucx {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> CreateUcx(const BackendOptions& o) {
  if (!o.store) {
    return absl::InvalidArgumentError(
        "backend 'ucx' exchanges worker addresses through a store: set BackendOptions::store");
  }
  UcxOptions uo;
  uo.comm = o.comm;
  return Create(o.rank, o.world_size, o.store, uo);
}

const FactoryRegistrar registrar("ucx", CreateUcx);

}  // namespace
}  // namespace loom::comm::ucx
