// The `mpi` backend's factory (comm/backend_registry.h).
#include "comm/backend_registry.h"
#include "comm/mpi/communicator.h"

namespace loom::comm::mpi {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpi(const BackendOptions& o) {
  MpiOptions mo;
  mo.comm = o.comm;
  return CreateWorld(mo);  // rank and size come from MPI
}

const FactoryRegistrar registrar("mpi", CreateMpi);

}  // namespace
}  // namespace loom::comm::mpi
