#ifndef LOOM_CORE_CUDA_MOE_H_
#define LOOM_CORE_CUDA_MOE_H_

// GPU twins of core/cpu/moe.h (the mixture-of-experts layer's per-token
// work). Activations (x, rows, y, dy, drows, dx) f32 or bf16, one dtype per
// call, math in f32 (dot products in double); logits, prob, dprob, dlogits
// f32; indices i32; stats and aux_grad f64. No atomics: every result is
// deterministic. The same shape checks as the CPU
// (core/ops/contracts/moe_checks.h); index values are not checked (that
// needs a host sync): an index out of range is skipped or gives a zero row.

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cuda {

absl::Status MoeRouteTopK(const Tensor& logits, const ops::MoeRouteOptions& o, Tensor* expert,
                          Tensor* prob, Tensor* stats);
absl::Status MoeRouteLayout(const Tensor& expert, const Tensor& prob,
                            const ops::MoeRouteOptions& o, Tensor* row, Tensor* row_token);
absl::Status MoePermute(const Tensor& x, const Tensor& row_token, Tensor* out);
absl::Status MoePermuteBackward(const Tensor& drows, const Tensor& row, Tensor* dx);
absl::Status MoeCombineForward(const Tensor& rows, const Tensor& prob, const Tensor& row,
                               Tensor* y);
absl::Status MoeCombineBackward(const Tensor& dy, const Tensor& rows, const Tensor& prob,
                                const Tensor& row, Tensor* drows, Tensor* dprob);
absl::Status MoeRouterBackward(const Tensor& logits, const Tensor& expert, const Tensor& prob,
                               const Tensor& dprob, const Tensor& aux_grad,
                               const ops::MoeRouterBackwardOptions& o, Tensor* dlogits);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_MOE_H_
