#ifndef LOOM_LAYERS_CONTEXT_PARALLEL_H_
#define LOOM_LAYERS_CONTEXT_PARALLEL_H_

// Context parallelism (Megatron's --context-parallel-size): the sequence is
// split across the CP ranks and causal attention runs as a ring.
//
// The split is Megatron's load-balanced zig-zag: the s positions are cut into
// 2·CP chunks of c = s / (2·CP); CP rank r holds chunks r and 2·CP-1-r, in
// that order, so every rank has the same share of the causal triangle's work
// (an early chunk sees few keys, its partner late chunk many).
//
// Ring attention: every rank keeps its Q and passes its K/V chunks around the
// ring of CP ranks, CP-1 hops, the send/receive of the next K/V overlapped
// with the attention of the current one (core/cpu/flash_attention.h's block
// API at GLOBAL positions, so the causal mask and the dropout mask are the
// whole-sequence kernel's). Partial results merge in the online softmax.
// Backward: K/V travel the same ring again together with their dK/dV
// accumulators, which arrive back at their owner after CP hops.
//
// Activations are [local s, b, ...] with local s = 2c: this rank's two
// chunks one after the other (LocalPositions says which global positions).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/cpu/attention.h"
#include "core/tensor.h"
#include "layers/tp_group.h"

namespace loom::layers {

struct ContextParallelLayout {
  int64_t seq_len = 0;  // global s; divisible by 2 * cp
  int cp = 1;
  int rank = 0;  // in the CP group

  int64_t chunk() const { return seq_len / (2 * cp); }
  int64_t local_len() const { return 2 * chunk(); }
  // Global position of this rank's first row of half h (0 or 1).
  int64_t HalfStart(int h) const { return HalfStartOf(rank, h); }
  int64_t HalfStartOf(int cp_rank, int h) const {
    return (h == 0 ? cp_rank : 2 * cp - 1 - cp_rank) * chunk();
  }
};

// The context-parallel group a model runs in, passed explicitly like TpGroup.
// With size 1 (comm may be null) activations hold the whole sequence and the
// attention is the planned kernel (attention_plan.h); CP > 1 runs the ring
// below, on the tensors' device (its blocks are core/ops kernels).
struct CpGroup {
  comm::Communicator* comm = nullptr;

  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool parallel() const { return size() > 1; }
  // The layout of a global sequence of `seq_len` positions over this group.
  ContextParallelLayout Layout(int64_t seq_len) const { return {seq_len, size(), rank()}; }
};

// A run of an activation's rows whose global sequence positions are
// consecutive: rows [local_first, local_first + count) hold positions
// [global_first, global_first + count).
struct RowRun {
  int64_t local_first = 0;
  int64_t count = 0;
  int64_t global_first = 0;
};
// The runs of rows [first, first + count) of this CP rank's local sequence
// (the 2c rows LocalPositions lists): one run, or two where they straddle
// the rank's two chunks. Sequence parallelism hands a TP rank a block of the
// local rows: `first` = its offset in them. Position embeddings, RoPE and
// hidden dropout masks follow these positions, so they are the CP = 1 ones.
std::vector<RowRun> GlobalRowRuns(const ContextParallelLayout& layout, int64_t first,
                                  int64_t count);

// The runs of an activation of `rows` rows held by this rank: under SP its
// block of the CP rank's local sequence (TP rank r holds rows [r·rows,
// (r+1)·rows)), else all of it. Unlike GlobalRowRuns, local_first counts
// from the activation's own first row.
std::vector<RowRun> ActivationRowRuns(const TpGroup& tp, const CpGroup& cp, int64_t rows);

// seq_len divisible by 2 * cp, 0 <= rank < cp; the error names
// --context-parallel-size and --seq-length.
absl::Status CheckContextParallelLayout(const ContextParallelLayout& layout);

// The global positions of this rank's local rows, in order.
std::vector<int64_t> LocalPositions(const ContextParallelLayout& layout);

// This rank's rows of a global tensor whose first dimension is the sequence
// ([s, ...] -> [2c, ...]). For data loading and tests.
absl::StatusOr<core::Tensor> SelectLocalRows(const core::Tensor& global,
                                             const ContextParallelLayout& layout);

// Causal attention over the CP group `cp` (size layout.cp, this rank
// layout.rank); tensors on one device (f32, or bf16 on a GPU; lse and the
// running state f32):
//   qkv:  f32[2c, b, heads * 3 * d]  (core/cpu/attention.h's layout)
//   out:  f32[2c, b, heads * d], written
//   lse:  f32[b, heads, 2c], written (keep with out for the backward)
// dropout: as the whole-sequence kernel's (its index uses global positions
// and the global sequence length).
absl::Status RingAttentionForward(comm::Communicator& cp, const ContextParallelLayout& layout,
                                  const core::Tensor& qkv, int64_t heads,
                                  const core::cpu::AttentionDropout& dropout, core::Tensor* out,
                                  core::Tensor* lse);

//   dout: f32[2c, b, heads * d]; qkv, out, lse: the forward's
//   dqkv: f32[2c, b, heads * 3 * d], written
absl::Status RingAttentionBackward(comm::Communicator& cp, const ContextParallelLayout& layout,
                                   const core::Tensor& dout, const core::Tensor& qkv,
                                   const core::Tensor& out, const core::Tensor& lse,
                                   int64_t heads, const core::cpu::AttentionDropout& dropout,
                                   core::Tensor* dqkv);

}  // namespace loom::layers

#endif  // LOOM_LAYERS_CONTEXT_PARALLEL_H_
