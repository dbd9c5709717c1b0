#ifndef LOOM_COMM_MPI_COMMUNICATOR_H_
#define LOOM_COMM_MPI_COMMUNICATOR_H_

// The `mpi` backend (OpenMPI): each collective is one MPI non-blocking call
// (MPI_Iallreduce, ...) behind a Work handle; sub-groups use MPI_Comm_split.
//
// Progress model: no progress thread. MPI advances non-blocking operations
// inside MPI calls, so Work::Poll/Wait call MPI_Testall. Every MPI call of the
// process goes through one mutex, so MPI_THREAD_SERIALIZED is enough even
// when several threads use different communicators.
// bf16/f16 reductions use user-defined MPI ops computing in f32; kAvg is a
// sum followed by a local division.
// Ranks that did not arrive cannot be known from MPI: a timeout's error says
// so. After a timeout the process cannot finalize MPI cleanly (operations to
// the dead peer stay pending); MPI_Finalize is then skipped.

#include <memory>

#include "absl/status/statusor.h"
#include "comm/comm.h"

namespace loom::comm::mpi {

struct MpiOptions {
  CommOptions comm;
  // OpenMPI's non-blocking all-reduce algorithm (libnbc), set through
  // OMPI_MCA_coll_libnbc_iallreduce_algorithm before MPI_Init unless that
  // variable is already set: "ring" (measured 1.1-2x the bandwidth of
  // blocking MPI_Allreduce at >= 256 KiB on 2 ranks, see BENCH_RESULTS.txt),
  // "binomial", "rabenseifner", or "" for OpenMPI's own choice.
  std::string iallreduce_algorithm = "ring";
};

// Initialises MPI and returns MPI_COMM_WORLD's communicator. Once per
// process: a second call is a FailedPrecondition error (split the world
// instead). MPI is finalized when the world and all its children are gone.
absl::StatusOr<std::unique_ptr<Communicator>> CreateWorld(const MpiOptions& options = {});

}  // namespace loom::comm::mpi

#endif  // LOOM_COMM_MPI_COMMUNICATOR_H_
