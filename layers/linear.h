#ifndef LOOM_LAYERS_LINEAR_H_
#define LOOM_LAYERS_LINEAR_H_

// Megatron's ColumnParallelLinear and RowParallelLinear (docs/PARALLELISM.md).
// Forward returns the output and fills a Saved record that the matching
// Backward consumes, so any number of micro-batches can be in flight (the
// pipeline keeps one Saved per micro-batch). Backward accumulates into the
// parameters' gradients and returns the input gradient; inside a
// DeferWeightGrads scope (a split backward's BackwardInput,
// layers/weight_grad_store.h) it computes dX and its TP reduction now and
// hands the weight-gradient GEMM (with the bias gradient it carries) and its
// operands to the store.
//
// Precision: the GEMMs follow the weight's dtype (bf16 on a GPU under
// --bf16, with bf16 activations). On the CPU under --bf16 the weight has a
// bf16 GEMM copy (Param::gemm_value) while activations, gradients and every
// other kernel stay f32: the three GEMMs (Y = X·Aᵀ, dX = dY·A, dA += dYᵀ·X)
// then round their f32 operands to bf16 and sum the products in f32 into f32
// outputs (core/cpu/matmul.h's bf16 mode: AMX or AVX512_BF16).

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/params.h"
#include "layers/tp_group.h"

namespace loom::layers {

// Y = X·Aᵀ + b with A split by output rows: weight [out/p, in], bias [out/p].
// No SP: X [s, b, in] is replicated (copy-to-TP); backward all-reduces dX,
// overlapped with the weight-gradient GEMM.
// SP: X [s/p, b, in] is all-gathered along s; only the shard is saved, and
// backward re-gathers it asynchronously and reduce-scatters dX while the
// weight gradient is computed. SP with TpGroup::comm_overlap
// (--tp-comm-overlap): the forward's gather and the backward's dX
// reduce-scatter are pipelined with the GEMM block by block
// (layers/tp_overlap.h); the input's re-gather stays one async all-gather.
// Output: [s, b, out/p] (stays split).
// Where core/ops's kernel choice "linear_epilogue" is "cublaslt" the bias
// (and the GELU MLP's GELU) ride on the GEMM (core/ops LinearForward /
// LinearBackwardWeight): the same math, one kernel.
// `in_features` > 0: the weight (and bias) are stored in another shape with
// the same elements (the --swiglu projection's [2, F·in/p]) and viewed as the
// row-major [numel / in_features, in_features] matrix (bias as a vector).
class ColumnParallelLinear {
 public:
  struct Saved {
    core::Tensor input;  // [s, b, in] or, with SP, the shard [s/p, b, in]
  };
  ColumnParallelLinear(Param* weight, Param* bias, TpGroup tp, int64_t in_features = 0)
      : w_(weight), b_(bias), tp_(tp), in_features_(in_features) {}

  // `pre_gelu` non-null (the GELU MLP's up-projection): returns gelu(Y) and
  // sets *pre_gelu = Y, what the backward's GELU derivative needs.
  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, Saved* saved,
                                       core::Tensor* pre_gelu = nullptr) const;
  // `bias_grad_done`: the bias gradient was already accumulated by the
  // producer of dy (RowParallelLinear::Backward's fused dGELU epilogue).
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const Saved& saved,
                                        bool bias_grad_done = false) const;

  // The bias gradient as [out/p] (a view of the parameter's), or an undefined
  // tensor without a bias.
  absl::StatusOr<core::Tensor> BiasGrad() const;

 private:
  // Y = X·Aᵀ + b on any rows (a sequence block with --tp-comm-overlap);
  // `act` defined: also gelu(Y) into it. Returns act if defined, else y.
  absl::StatusOr<core::Tensor> ForwardRows(const core::Tensor& x, const core::Tensor& y,
                                           const core::Tensor& act) const;
  // The weight's value or gradient as the [out/p, in] GEMM operand, the
  // bias's as [out/p] (views of the parameter's storage).
  absl::StatusOr<core::Tensor> Matrix(const core::Tensor& t) const;
  absl::StatusOr<core::Tensor> Vector(const core::Tensor& t) const;

  Param* w_;
  Param* b_;  // may be null
  TpGroup tp_;
  int64_t in_features_;  // 0: the weight's dim 1
};

// Y = X·Aᵀ + b with A split by input columns: weight [out, in/p], bias [out]
// full and added after the reduction. Input [s, b, in/p] (split).
// No SP: forward all-reduces the partial output; backward is local.
// SP: forward reduce-scatters along s to [s/p, b, out]; backward all-gathers dY.
// With TpGroup::comm_overlap both pipelined with the GEMM block by block.
// With the "cublaslt" linear epilogue the bias rides on the forward GEMM only
// where the reduction is the identity (TP size 1: adding it before a sum over
// ranks would add it p times), and its gradient on the weight-gradient GEMM
// only without SP (with SP it is the sum over this rank's dY shard, not over
// the gathered dY the GEMM reads).
class RowParallelLinear {
 public:
  struct Saved {
    core::Tensor input;  // [s, b, in/p]
  };
  // The GELU MLP's down-projection backward: dX goes through GELU's derivative
  // at `pre` (the up-projection's output, [s, b, in/p]); `up_bias_grad` (may
  // be undefined) is the up-projection's bias gradient, which the fused dGELU
  // epilogue accumulates (then `*up_bias_grad_done` is set).
  struct GeluGrad {
    const core::Tensor* pre = nullptr;
    core::Tensor up_bias_grad;
    bool* up_bias_grad_done = nullptr;
  };
  RowParallelLinear(Param* weight, Param* bias, TpGroup tp) : w_(weight), b_(bias), tp_(tp) {}

  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, Saved* saved) const;
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const Saved& saved,
                                        const GeluGrad* gelu = nullptr) const;

 private:
  // The partial product X·Aᵀ (bias on the GEMM with `fused_bias`) and dX =
  // dY·A (through GELU's derivative at `pre` with `gelu`) on any rows.
  absl::Status ForwardRows(const core::Tensor& x, const core::Tensor& partial,
                           bool fused_bias) const;
  absl::Status BackwardRows(const core::Tensor& dy, const core::Tensor& dx,
                            const core::Tensor& pre, const GeluGrad* gelu, bool fused) const;

  Param* w_;
  Param* b_;  // may be null
  TpGroup tp_;
};

// [s, b, k] viewed as [s·b, k] (the GEMM operand form of an activation).
absl::StatusOr<core::Tensor> As2D(const core::Tensor& x);

}  // namespace loom::layers

#endif  // LOOM_LAYERS_LINEAR_H_
