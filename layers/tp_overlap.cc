#include "layers/tp_overlap.h"

#include <vector>

#include "comm/comm.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "layers/mappings.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;

// The ring's messages between two TP ranks (one tag: between two ranks they
// arrive in the order sent, which is the ring's order).
constexpr int kRingTag = 0x7470;

absl::StatusOr<Shape> WithRows(const Shape& s, int64_t rows) {
  int64_t dims[Shape::kMaxRank];
  for (int i = 0; i < s.rank(); ++i) dims[i] = s.dim(i);
  dims[0] = rows;
  return Shape::Make(dims, s.rank());
}

// One ring step: `send` to `to` and `recv` from `from`, both at once.
comm::WorkPtr Exchange(const TpGroup& tp, const Tensor& send, int to, const Tensor& recv,
                       int from) {
  using Kind = comm::P2POp::Kind;
  return tp.comm->BatchSendRecv(
      {comm::P2POp{Kind::kSend, send, to, kRingTag}, comm::P2POp{Kind::kRecv, recv, from, kRingTag}});
}

// Waits for `work` (if any) and returns the first error of it and `first`.
absl::Status Finish(const TpGroup& tp, const comm::WorkPtr& work, absl::Status first) {
  absl::Status waited = WaitTp(tp, work);
  return first.ok() ? waited : first;
}

}  // namespace

absl::Status RingAllGatherSeq(const TpGroup& tp, const Tensor& x, Tensor* full,
                              const BlockFn& compute) {
  if (!tp.parallel()) {
    *full = x;
    return compute(0, x);
  }
  if (x.rank() < 1) return absl::InvalidArgumentError("RingAllGatherSeq: rank-0 input");
  const int p = tp.size(), r = tp.rank();
  const int64_t n = x.dim(0);
  LOOM_ASSIGN_OR_RETURN(const Shape shape, WithRows(x.shape(), n * p));
  LOOM_ASSIGN_OR_RETURN(*full, Tensor::Empty(shape, x.dtype(), x.device()));
  std::vector<Tensor> blocks(p);
  for (int i = 0; i < p; ++i) {
    LOOM_ASSIGN_OR_RETURN(blocks[i], full->Narrow(i * n, n));
  }
  LOOM_RETURN_IF_ERROR(core::ops::Copy(x, &blocks[r]));
  // Step k holds block (r + k) mod p: it passes that block on to rank r - 1
  // (whose step k + 1 needs it) and receives block (r + k + 1) from rank
  // r + 1, while computing on the block it holds.
  const int prev = (r + p - 1) % p, next = (r + 1) % p;
  int held = r;
  for (int k = 0; k < p; ++k) {
    const int coming = (held + 1) % p;
    comm::WorkPtr step = k + 1 < p ? Exchange(tp, blocks[held], prev, blocks[coming], next)
                                   : nullptr;
    LOOM_RETURN_IF_ERROR(Finish(tp, step, compute(held, blocks[held])));
    held = coming;
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> RingReduceScatterSeq(const TpGroup& tp, const Shape& block_shape,
                                            const Tensor& like, const BlockFn& produce) {
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(block_shape, like.dtype(), like.device()));
  if (!tp.parallel()) {
    LOOM_RETURN_IF_ERROR(produce(0, out));
    return out;
  }
  const int p = tp.size(), r = tp.rank();
  // Two send buffers (the next block is produced while the last one is
  // still being sent) and one receive buffer (read before the next receive
  // is posted).
  Tensor partial[2], incoming;
  for (Tensor* t : {&partial[0], &partial[1], &incoming}) {
    LOOM_ASSIGN_OR_RETURN(*t, Tensor::Empty(block_shape, like.dtype(), like.device()));
  }
  // The running sum of block t starts at rank t + 1 and moves to rank + 1
  // each step, so it ends at rank t after p - 1 exchanges: step k of rank r
  // works on block (r - 1 - k) mod p, the last (k = p - 1) on block r.
  const int prev = (r + p - 1) % p, next = (r + 1) % p;
  comm::WorkPtr in_flight;
  for (int k = 0; k < p; ++k) {
    const int block = ((r - 1 - k) % p + p) % p;
    Tensor sum = k + 1 == p ? out : partial[k % 2];
    LOOM_RETURN_IF_ERROR(Finish(tp, in_flight, produce(block, sum)));
    in_flight = nullptr;
    if (k > 0) LOOM_RETURN_IF_ERROR(core::ops::Add(sum, incoming, &sum));
    if (k + 1 < p) in_flight = Exchange(tp, sum, next, incoming, prev);
  }
  return out;
}

}  // namespace loom::layers
