#ifndef LOOM_LAYERS_ATTENTION_H_
#define LOOM_LAYERS_ATTENTION_H_

#include "absl/status/statusor.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "layers/linear.h"
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
};

// The stream id of one dropout site of one layer.
uint64_t DropoutSite(uint64_t stream, int64_t layer, int site);

// Self-attention with heads split over TP: a fused column-parallel QKV
// projection (each rank owns heads/p whole heads: the QKV weight rows are
// ordered [head, {q,k,v}, d]), causal softmax attention, and a row-parallel
// output projection.
class ParallelAttention {
 public:
  struct Saved {
    ColumnParallelLinear::Saved qkv_in;
    core::Tensor qkv;    // [s, b, 3h/p]
    core::Tensor probs;  // [b, heads/p, s, s], softmax before attention dropout
    RowParallelLinear::Saved proj_in;
  };
  ParallelAttention(Param* qkv_w, Param* qkv_b, Param* proj_w, Param* proj_b, int64_t heads,
                    TpGroup tp, int64_t layer)
      : qkv_(qkv_w, qkv_b, tp), proj_(proj_w, proj_b, tp), heads_(heads), tp_(tp), layer_(layer) {}

  // x: [s(/p), b, h] -> [s(/p), b, h] (before the residual's dropout).
  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, const DropoutStream& dropout,
                                       Saved* saved) const;
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const DropoutStream& dropout,
                                        const Saved& saved) const;

 private:
  // The attention-dropout options of this layer and rank (p = 0 when not training).
  core::ops::AttentionDropout KernelDropout(const DropoutStream& dropout) const;

  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
  int64_t heads_;  // global head count
  TpGroup tp_;
  int64_t layer_;
};

// Column-parallel up-projection to ffn/p, GELU, row-parallel down-projection.
class ParallelMlp {
 public:
  struct Saved {
    ColumnParallelLinear::Saved up_in;
    core::Tensor pre_gelu;  // [s, b, ffn/p]
    RowParallelLinear::Saved down_in;
  };
  ParallelMlp(Param* up_w, Param* up_b, Param* down_w, Param* down_b, TpGroup tp)
      : up_(up_w, up_b, tp), down_(down_w, down_b, tp) {}

  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, Saved* saved) const;
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const Saved& saved) const;

 private:
  ColumnParallelLinear up_;
  RowParallelLinear down_;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_ATTENTION_H_
