// What Loom knows about the `mpi` backend (comm/backend_registry.h).
#include "comm/backend_registry.h"

namespace loom::comm::mpi {
namespace {

BackendInfo Info() {
  BackendInfo b;
  b.name = "mpi";
  b.device = BackendDevice::kHost;
  b.needs_store = false;  // MPI_Init connects the ranks
  b.launched_by = LaunchedBy::kMpirun;
  // OpenMPI 4.1 MCA parameters.
  b.network = {{"ethernet", {{"OMPI_MCA_pml", "ob1"}, {"OMPI_MCA_btl", "tcp,self,vader"}}},
               {"infiniband", {{"OMPI_MCA_pml", "ucx"}}}};
  // libnbc neither checks that ranks issue the same op, nor can a world whose
  // op failed be finalized; MPI_Init runs once per process.
  b.conformance.detects_mismatch = false;
  b.conformance.names_missing_ranks = false;
  b.conformance.one_world_per_process = true;
  return b;
}

const BackendRegistrar registrar(Info());

}  // namespace
}  // namespace loom::comm::mpi
