#ifndef LOOM_COMM_TESTING_RANKS_AS_THREADS_H_
#define LOOM_COMM_TESTING_RANKS_AS_THREADS_H_

// Ranks as threads of one test process: the one harness Loom's own tests use
// to run a body on every rank at once (target //comm/testing:ranks_as_threads,
// testonly, not for embedders).
//
//   absl::Status s = comm::testing::RunRanksAsThreads(4, [&](int rank, comm::Communicator* c) {
//     return c->AllReduce(t[rank], comm::ReduceOp::kSum)->Wait();
//   });
//
// Every function starts all threads, joins all of them (however long the
// slowest takes: a rank stuck in a collective ends at the communicator's
// timeout), and then reports. Nothing here uses gtest.

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "comm/comm.h"
#include "comm/local/communicator.h"

namespace loom::comm::testing {

// What the threads of one run returned.
struct RankStatuses {
  // each[r]: what rank r returned, unchanged.
  std::vector<absl::Status> each;
  // OK, or the error that was returned first (in time: usually the cause,
  // where the others then fail waiting for that rank), with its code and
  // the message prefixed "rank r: ".
  absl::Status first;
  // OK, or the error of the lowest-numbered failing rank, prefixed the same
  // way: for checks of what one rank says (rank 0 naming a peer's failure).
  absl::Status lowest;
};

// fn(rank) on `n` threads, rank = 0 .. n-1. For ranks that make their own
// communicator (a backend factory, NCCL with one GPU each) or use none.
RankStatuses RunThreads(int n, const std::function<absl::Status(int rank)>& fn);  // n < 0: none

// fn(rank, comm) on `world_size` threads, each with its communicator of one
// fresh local world (//comm/local, `options`), destroyed after the join.
// If the world cannot be made, every rank's status (and `first`, `lowest`)
// says why.
RankStatuses RunRanksAsThreadsEach(
    int world_size, const std::function<absl::Status(int rank, Communicator* comm)>& fn,
    const local::LocalOptions& options = {});

// The same, reporting only RankStatuses::first.
absl::Status RunRanksAsThreads(
    int world_size, const std::function<absl::Status(int rank, Communicator* comm)>& fn,
    const local::LocalOptions& options = {});

}  // namespace loom::comm::testing

#endif  // LOOM_COMM_TESTING_RANKS_AS_THREADS_H_
