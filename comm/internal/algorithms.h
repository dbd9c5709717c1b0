#ifndef LOOM_COMM_INTERNAL_ALGORITHMS_H_
#define LOOM_COMM_INTERNAL_ALGORITHMS_H_

// Our collective algorithms, written as steps of point-to-point exchanges
// within a group of `size` ranks. How the bytes move, and how the messages
// of one step, op and group are told apart, is the caller's (engine.h runs
// these over a Transport). Chosen by message size:
//   all-reduce   <= small_bytes (or fewer elements than ranks): recursive
//                doubling (power-of-two groups) or all-to-all exchange +
//                rank-ordered reduction; larger: ring reduce-scatter + ring
//                all-gather.
//   reduce-scatter / all-gather: ring.  broadcast / reduce: binomial tree.
//   all-to-all (equal and per-peer counts): <= small_bytes moved by this
//                rank: every pair at once; larger: pairwise exchange, n-1
//                steps.
//   barrier: dissemination.
// Every rank computes bitwise identical all-reduce results (the same
// operands in the same order everywhere), in place or not. Arguments are
// checked beforehand (checks.h).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "comm/comm.h"
#include "core/tensor.h"

namespace loom::comm::internal {

// One message of an algorithm step: sent to or received from group rank
// `peer`. `step` tells apart the messages of one op between one pair (< 64
// distinct values are enough: one pair's messages of one op arrive in order).
struct Leg {
  bool is_send;
  int peer;
  int step;
  void* buf;
  size_t bytes;
};

// What the algorithms run on: one op of one rank.
class Steps {
 public:
  virtual ~Steps() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Posts every leg (the receives first) and waits until all are done.
  virtual absl::Status Exchange(absl::Span<const Leg> legs) = 0;
  // Staging buffer `i` (0 or 1) of at least `bytes`, reused across ops.
  virtual char* Stage(int i, size_t bytes) = 0;
};

// Byte offsets of consecutive blocks of counts[j] elements of `elem_bytes`
// each: block j is [off[j], off[j + 1]) (all-to-all layouts; nccl uses it too).
std::vector<size_t> BlockOffsets(absl::Span<const int64_t> counts, size_t elem_bytes);

absl::Status RunAllReduce(Steps& s, const core::Tensor& in, const core::Tensor& out, ReduceOp op,
                          size_t small_bytes);
absl::Status RunBroadcast(Steps& s, const core::Tensor& in, const core::Tensor& out, int root);
absl::Status RunReduce(Steps& s, const core::Tensor& in, const core::Tensor& out, ReduceOp op,
                       int root);
absl::Status RunAllGather(Steps& s, const core::Tensor& in, const core::Tensor& out);
absl::Status RunReduceScatter(Steps& s, const core::Tensor& in, const core::Tensor& out,
                              ReduceOp op);
absl::Status RunAllToAll(Steps& s, const core::Tensor& in, const core::Tensor& out,
                         size_t small_bytes);
absl::Status RunAllToAllV(Steps& s, const core::Tensor& in, absl::Span<const int64_t> send_counts,
                          const core::Tensor& out, absl::Span<const int64_t> recv_counts,
                          size_t small_bytes);
absl::Status RunBarrier(Steps& s);

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_ALGORITHMS_H_
