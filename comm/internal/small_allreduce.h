#ifndef LOOM_COMM_INTERNAL_SMALL_ALLREDUCE_H_
#define LOOM_COMM_INTERNAL_SMALL_ALLREDUCE_H_

// The latency path of all-reduce as a plan of exchange steps, so one
// algorithm serves both ways of running it: blocking, step after step
// (algorithms.cc over Steps: the local and UCX backends), and as a state
// machine that the mpi backend advances whenever any of its ops is polled.
//   power-of-two groups: recursive doubling, log2(n) pairwise exchanges;
//   others: one all-to-all exchange, then a rank-ordered reduction.
// Every rank computes bitwise identical results: the same operands are
// combined in the same order everywhere. Nothing here allocates for
// power-of-two groups (the mpi backend's latency is the point).

#include <cstddef>
#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "comm/comm.h"
#include "comm/internal/algorithms.h"
#include "core/dtype.h"

namespace loom::comm::internal {

class SmallAllReduce {
 public:
  using Legs = absl::InlinedVector<Leg, 2>;

  // Bytes of staging for `bytes` of operand in a group of `size`.
  static size_t StageBytes(int size, size_t bytes);

  // Rank `rank` of `size` (>= 2). `dst` holds this rank's operand (`count`
  // elements of `dtype`, `bytes` in all) and, after the last Finish, the
  // result; `stage` holds StageBytes(size, bytes). Both must stay put until
  // the plan is done. kAvg leaves the sum (FinishAvg).
  SmallAllReduce(int rank, int size, char* dst, char* stage, size_t bytes, int64_t count,
                 core::DType dtype, ReduceOp op);

  int steps() const;
  // Step i's messages: post them together (receives first), await them all,
  // then call Finish(i).
  Legs StepLegs(int i) const;
  void Finish(int i) const;

 private:
  bool pow2() const { return (size_ & (size_ - 1)) == 0; }

  int rank_, size_;
  char* dst_;
  char* stage_;
  size_t bytes_;
  int64_t count_;
  core::DType dtype_;
  ReduceOp op_;
};

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_SMALL_ALLREDUCE_H_
