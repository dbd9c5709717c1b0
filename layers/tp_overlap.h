#ifndef LOOM_LAYERS_TP_OVERLAP_H_
#define LOOM_LAYERS_TP_OVERLAP_H_

// --tp-comm-overlap (TpGroup::comm_overlap, with sequence parallelism): the
// all-gather before a GEMM and the reduce-scatter after one, split into the
// p sequence blocks of the TP ranks and pipelined with the GEMM over those
// blocks as a ring exchange (Transformer Engine's userbuffers "ring
// exchange" overlap): while the GEMM of the block received in step k runs,
// the block of step k + 1 is in flight. Each step is one BatchSendRecv
// (send to rank - 1, receive from rank + 1, or the reverse for the
// reduce-scatter), so p - 1 exchanges of s/p rows replace one collective.
//
// Numbers: the all-gather moves the same bytes as the collective, and the
// reduce-scatter sums a block's p partials in ring order
// ((x_{t+1} + x_{t+2}) + ...) + x_t, in the activation dtype: bit for bit
// the collective's sum at p = 2 (one addition), within f32 rounding above.
// A GEMM over a block gives the whole GEMM's rows only within rounding:
// oneDNN's sgemm picks kernel and blocking by the row count (up to 5e-7
// relative measured), so the layers with overlap match those without
// within 1e-6 (models/gpt/tp_overlap_test.cc), not bit for bit.

#include <functional>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/tp_group.h"

namespace loom::layers {

// Computes on block `block` of the sequence (rows [block·n, (block+1)·n) of
// the full [s, ...] tensor, n = s/p): `rows` is that block's view.
using BlockFn = std::function<absl::Status(int block, const core::Tensor& rows)>;

// All-gathers x [s/p, ...] along dim 0 into *full [s, ...] (allocated here)
// while calling compute(block, full's rows of block) once per block, each as
// soon as its rows have arrived, its own block first. Every TP rank calls it.
absl::Status RingAllGatherSeq(const TpGroup& tp, const core::Tensor& x, core::Tensor* full,
                              const BlockFn& compute);

// Reduce-scatter along dim 0 of a tensor produced block by block:
// produce(block, out) writes this rank's partial of `block` into `out`
// ([s/p, ...] = block_shape, overwritten). Returns the sum over ranks of
// block `rank` ([s/p, ...]), producing each next block while the running
// sum of the previous one travels to the next rank.
absl::StatusOr<core::Tensor> RingReduceScatterSeq(const TpGroup& tp, const core::Shape& block_shape,
                                                  const core::Tensor& like, const BlockFn& produce);

}  // namespace loom::layers

#endif  // LOOM_LAYERS_TP_OVERLAP_H_
