// The `nccl` backend's factory (comm/backend_registry.h).
#include "comm/backend_registry.h"
#include "comm/nccl/communicator.h"

namespace loom::comm::nccl {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNccl(const BackendOptions& o) {
  if (!o.store) {
    return absl::InvalidArgumentError(
        "backend 'nccl' publishes NCCL's unique id through a store: set BackendOptions::store");
  }
  NcclOptions no;
  no.comm = o.comm;
  no.local_rank = o.local_rank;  // the GPU of this rank
  return Create(o.rank, o.world_size, o.store, no);
}

const FactoryRegistrar registrar("nccl", CreateNccl);

}  // namespace
}  // namespace loom::comm::nccl
