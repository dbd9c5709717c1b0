#ifndef LOOM_COMM_MPI_COMMUNICATOR_H_
#define LOOM_COMM_MPI_COMMUNICATOR_H_

// The `mpi` backend (OpenMPI): each collective is one MPI non-blocking call
// (MPI_Iallreduce, ...) behind a Work handle, except small all-reduces
// (<= small_allreduce_bytes): libnbc's schedules cost about twice blocking
// MPI_Allreduce's latency, so these run comm/internal/small_allreduce.h's
// plan (recursive doubling) as MPI_Isend/MPI_Irecv steps on a duplicate of
// the communicator, advanced whenever any op of the process is polled. Split gathers every rank's
// (color, key) with MPI_Iallgather under the op timeout (DeadlineExceeded,
// never a hang, and no MPI lock held while it waits), then makes the child
// with MPI_Comm_create_group among its members only.
//
// Progress model: no progress thread. MPI advances non-blocking operations
// inside MPI calls, so Work::Poll/Wait call MPI_Testall. Every MPI call of the
// process goes through one mutex, so MPI_THREAD_SERIALIZED is enough even
// when several threads use different communicators.
// bf16/f16 reductions use user-defined MPI ops computing in f32; kAvg is a
// sum followed by a local division.
// Ranks that did not arrive cannot be known from MPI: a timeout's error says
// so. Failure (comm.h): a failed op (timeout, MPI error, argument error)
// aborts its communicator; its requests may stay pending in MPI, so the
// buffers they may touch (the op's tensors, its staging) are kept until MPI
// completes them (receives are cancelled; sends and collectives cannot be).
// After a timeout or an MPI error the process cannot finalize MPI cleanly
// (operations to a dead peer stay pending); MPI_Finalize is then skipped and
// what is still pending keeps its memory for the life of the process.

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
  // All-reduces of at most this many bytes run our point-to-point plan
  // (see above); 0: every all-reduce is MPI_Iallreduce.
  size_t small_allreduce_bytes = 32 << 10;
};

// Initialises MPI and returns MPI_COMM_WORLD's communicator. Once per
// process: a second call is a FailedPrecondition error (split the world
// instead). MPI is finalized when the world and all its children are gone.
absl::StatusOr<std::unique_ptr<Communicator>> CreateWorld(const MpiOptions& options = {});

}  // namespace loom::comm::mpi

#endif  // LOOM_COMM_MPI_COMMUNICATOR_H_
