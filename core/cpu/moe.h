#ifndef LOOM_CORE_CPU_MOE_H_
#define LOOM_CORE_CPU_MOE_H_

// The mixture-of-experts layer's per-token work (layers/moe.h), as kernels:
// the router's top-k and statistics, the dispatch layout, the permutation of
// token rows into expert order and back, the combine and its backward, the
// router's backward. These are the host loops the MoE layer ran before it
// moved onto core/ops, in the same order (bitwise: core/cpu/moe_test), and
// the oracle of the CUDA ones. Shapes: core/ops/contracts/moe_checks.h (T
// tokens, E experts, K = topk, N dispatched rows, h hidden). Indices are
// i32; activations, probabilities and logits f32; statistics f64.

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::MoeRouteOptions;
using ops::MoeRouterBackwardOptions;

// Per token: the top-K experts by logit (ties: the lower index), expert
// [T, K] in that order, prob [T, K] = softmax over the K chosen logits (in
// double). stats f64 [2E + 1]: assignments per expert, Σ_t softmax(logits_t)_e,
// Σ_t lse_t² (token order).
absl::Status MoeRouteTopK(const Tensor& logits, const MoeRouteOptions& o, Tensor* expert,
                          Tensor* prob, Tensor* stats);

// The dispatch layout: each expert's assignments in token order (slot t·K + k
// order); with a capacity each expert keeps its `capacity` most probable
// (ties: the earlier slot) and, padded, owns `capacity` rows. Experts follow
// one another. row [T, K]: the assignment's row, -1 if dropped; row_token
// [N]: the token of each row, -1 for padding. N must be the layout's row count
// (Σ_e rows of e; the caller knows it from the counts).
absl::Status MoeRouteLayout(const Tensor& expert, const Tensor& prob, const MoeRouteOptions& o,
                            Tensor* row, Tensor* row_token);

// out [N, h]: row i is x[row_token[i]], zeros where row_token[i] is -1.
absl::Status MoePermute(const Tensor& x, const Tensor& row_token, Tensor* out);

// dx [T, h] (written): dx_t = Σ drows[row(t, k)] over t's kept assignments,
// added in ascending row order from zero (the scatter-add of rows it
// replaces; no atomics on any device).
absl::Status MoePermuteBackward(const Tensor& drows, const Tensor& row, Tensor* dx);

// y [T, h] (written): y_t = Σ_k prob_tk · rows[row(t, k)] in k order from
// zero, skipping dropped assignments.
absl::Status MoeCombineForward(const Tensor& rows, const Tensor& prob, const Tensor& row,
                               Tensor* y);

// drows [N, h] (written): prob_tk · dy_t at row(t, k), zeros in rows no
// assignment owns; dprob [T, K] (written): ⟨dy_t, rows[row(t, k)]⟩ summed in
// double, 0 where dropped.
absl::Status MoeCombineBackward(const Tensor& dy, const Tensor& rows, const Tensor& prob,
                                const Tensor& row, Tensor* drows, Tensor* dprob);

// dlogits [T, E] (written) through the softmax over the K chosen logits
// (dropped assignments take part with their dprob of 0), plus the aux loss's
// gradient aux_grad[e] (f64 [E]) and the z loss's, through the softmax over
// all E logits (in double).
absl::Status MoeRouterBackward(const Tensor& logits, const Tensor& expert, const Tensor& prob,
                               const Tensor& dprob, const Tensor& aux_grad,
                               const MoeRouterBackwardOptions& o, Tensor* dlogits);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_MOE_H_
