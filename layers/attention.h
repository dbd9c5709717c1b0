#ifndef LOOM_LAYERS_ATTENTION_H_
#define LOOM_LAYERS_ATTENTION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/ops/attention_plan.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "layers/context_parallel.h"
#include "layers/linear.h"
#include "layers/packed_documents.h"
#include "layers/params.h"
#include "layers/tp_group.h"

namespace loom::layers {

// Where a micro-batch's dropout masks come from: Philox keyed by (seed,
// stream), indexed by the element's place in the global tensor, so every
// layout draws the same masks. `stream` identifies (iteration, micro-batch)
// and is refined per layer and per dropout site.
struct DropoutStream {
  float hidden_p = 0.0f;     // --hidden-dropout
  float attention_p = 0.0f;  // --attention-dropout
  uint64_t seed = 0;
  uint64_t stream = 0;
  bool training = true;      // false: dropout is the identity (evaluation)
  // The documents packed into the micro-batch's sequences (--reset-position-ids,
  // --reset-attention-mask): they travel with the micro-batch's dropout
  // stream because it reaches every layer's forward and backward (and the
  // recomputed ones). Null: one sequence per row, positions 0..s-1.
  std::shared_ptr<const PackedDocuments> documents;
};

// The stream id of one dropout site of one layer.
uint64_t DropoutSite(uint64_t stream, int64_t layer, int site);

// The attention variant: heads, K/V groups (GQA) and rotary embeddings.
struct AttentionOptions {
  int64_t heads = 1;         // global query heads
  int64_t query_groups = 0;  // global K/V heads (--num-query-groups); 0: one per head
  bool rope = false;         // rotate q and k (--position-embedding-type=rope)
  core::ops::RopeOptions rope_options;  // base and rotary dim (position_offset unused)
  // Selective recomputation (--recompute-granularity=selective): Forward
  // keeps only the core's input (Saved::qkv), not what the attention kernel
  // keeps for its backward (Saved::out, Saved::lse); Backward reruns the
  // kernel's forward first (same dropout mask, so the gradients are
  // bit-identical).
  bool recompute_core = false;
};

// Self-attention with heads split over TP: a fused column-parallel QKV
// projection, causal softmax attention (the flash kernel,
// core/cpu/flash_attention.h: O(s·d) memory, no s x s probabilities), and a
// row-parallel output projection.
// The projection's rows are ordered [group, {q x heads/groups, k, v}, d]
// (gpt_config.h): each rank owns groups/p whole query groups, i.e. heads/p
// query heads and their K/V heads. Without GQA and RoPE that is GPT-2's
// [head, {q, k, v}, d] and the projection feeds the attention kernel as is.
// With GQA and/or RoPE the projection's [s, b, (heads + 2·groups)/p · d] is
// rearranged into the kernel's [s, b, heads/p, {q, k, v}, d] by row gathers
// (EmbeddingForward over d-wide rows: each query head gets its group's k and
// v; q and k are rotated on the way) and the backward scatter-adds (sums the
// k/v gradients of a group's heads) and rotates back; or, where the kernel
// manifest chooses "fused" for "qkv_split", by QkvSplitRopeForward /
// QkvSplitRopeBackward (no index tables, no atomics; bitwise the same on the
// CPU). The attention always
// sees the whole sequence (SP gathers it in the projection), so the RoPE
// position of row i is i on every layout and pipeline stage; under context
// parallelism it sees this CP rank's two chunks, rotated at their global
// positions, and runs as ring attention over the CP group
// (layers/context_parallel.h; the trainer still refuses CP with --device=cuda
// until the ring's CUDA kernels have passed on a device).
class ParallelAttention {
 public:
  struct Saved {
    ColumnParallelLinear::Saved qkv_in;
    core::Tensor qkv;  // [s, b, heads/p · 3 · d]: the attention kernel's input
    // The attention implementation this call ran (core/ops/attention_plan.h:
    // the kernel manifest's choice for the device); the backward runs its twin.
    core::ops::AttentionPlan plan;
    // The kernel's output [s, b, heads/p · d] (the output projection's input:
    // the same storage as proj_in's) and what its backward needs: the
    // log-sum-exp of every score row [b, heads/p, s] (f32 on every device;
    // flash-contract plans and the CP ring), or the s x s kernel's
    // probabilities [b, heads/p, s, s]. Undefined with recompute_core.
    core::Tensor out, lse, probs;
    // Row indices of the rearrangement (undefined for GPT-2): `gather` picks
    // the kernel's rows from the table, `table` the table's rows (RoPE: q and
    // k heads, then v heads) from the projection's rows.
    core::Tensor gather_ids, table_ids;
    // The rearrangement ran the fused QkvSplitRope kernels (the kernel
    // manifest's "qkv_split" choice) instead of the index tables above.
    bool fused_split = false;
    RowParallelLinear::Saved proj_in;
  };
  ParallelAttention(Param* qkv_w, Param* qkv_b, Param* proj_w, Param* proj_b,
                    const AttentionOptions& options, TpGroup tp, CpGroup cp, int64_t layer)
      : qkv_(qkv_w, qkv_b, tp),
        proj_(proj_w, proj_b, tp),
        options_(options),
        heads_(options.heads),
        groups_(options.query_groups > 0 ? options.query_groups : options.heads),
        tp_(tp),
        cp_(cp),
        layer_(layer) {}

  // x: [s(/p), b, h] -> [s(/p), b, h] (before the residual's dropout).
  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, const DropoutStream& dropout,
                                       Saved* saved) const;
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const DropoutStream& dropout,
                                        const Saved& saved) const;

 private:
  // The attention-dropout options of this layer and rank (p = 0 when not training).
  core::ops::AttentionDropout KernelDropout(const DropoutStream& dropout) const;
  // True when the projection is not the kernel's layout (GQA or RoPE).
  bool Rearranged() const { return groups_ != heads_ || options_.rope; }
  // Fills saved->gather_ids / table_ids for `rows` = s·b token rows.
  absl::Status MakeIds(int64_t rows, const core::Tensor& like, Saved* saved) const;
  // Rotates (or, backward, un-rotates) q and k rows [s, b, heads + groups, d]
  // in place at their global positions, or at the packed documents' position
  // ids (`documents` non-null with position ids).
  absl::Status Rotate(core::Tensor* qk, bool backward, const PackedDocuments* documents) const;
  // The fused rearrangement: proj -> qkv (forward) or dqkv -> dproj, with RoPE
  // at the rows' global positions (one call per row run under CP).
  absl::Status FusedSplit(const core::Tensor& in, core::Tensor* out, bool backward) const;
  // The attention kernel: the planned one on the whole sequence (`kept`:
  // its lse or probs, allocated here), or the CP ring (lse).
  absl::Status CoreForward(const core::ops::AttentionPlan& plan, const core::Tensor& qkv,
                           const DropoutStream& dropout, core::Tensor* out,
                           core::Tensor* kept) const;
  absl::Status CoreBackward(const core::ops::AttentionPlan& plan, const core::Tensor& dout,
                            const core::Tensor& qkv, const core::Tensor& out,
                            const core::Tensor& kept, const DropoutStream& dropout,
                            core::Tensor* dqkv) const;
  // The plan for this layer's attention on `qkv` (the ring's lse under CP).
  absl::StatusOr<core::ops::AttentionPlan> Plan(const core::Tensor& qkv,
                                                const DropoutStream& dropout) const;

  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
  AttentionOptions options_;
  int64_t heads_;   // global head count
  int64_t groups_;  // global K/V head count
  TpGroup tp_;
  CpGroup cp_;
  int64_t layer_;
};

// Column-parallel up-projection to ffn/p, GELU, row-parallel down-projection.
// `swiglu`: the up-projection gives [gate_shard; up_shard] (2·ffn/p, its
// weight stored [2, ffn·h/p], see gpt_config.h), then silu(gate) · up.
class ParallelMlp {
 public:
  struct Saved {
    ColumnParallelLinear::Saved up_in;
    core::Tensor pre_gelu;  // [s, b, ffn/p] (SwiGLU: [s, b, 2·ffn/p]), before the activation
    RowParallelLinear::Saved down_in;
  };
  ParallelMlp(Param* up_w, Param* up_b, Param* down_w, Param* down_b, TpGroup tp,
              bool swiglu = false)
      : up_(up_w, up_b, tp, swiglu ? down_w->shape.dim(0) : 0),
        down_(down_w, down_b, tp),
        swiglu_(swiglu) {}

  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, Saved* saved) const;
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const Saved& saved) const;

 private:
  ColumnParallelLinear up_;
  RowParallelLinear down_;
  bool swiglu_;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_ATTENTION_H_
