#ifndef LOOM_CORE_OPS_CONTRACTS_MOE_CHECKS_H_
#define LOOM_CORE_OPS_CONTRACTS_MOE_CHECKS_H_

// The shape contracts of the mixture-of-experts ops (op_list.h: MoeRouteTopK,
// MoeRouteLayout, MoePermute, MoePermuteBackward, MoeCombineForward,
// MoeCombineBackward, MoeRouterBackward), shared by every device so a bad
// argument gets the same InvalidArgument everywhere. Shapes and options
// only; dtypes, placement and index values are each device's (the CPU checks
// index ranges; a device cannot without a host sync).
//
// Names: T tokens, E experts, K = topk, N dispatched rows, h hidden.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::ops {

struct MoeDims {
  int64_t tokens = 0, experts = 0, topk = 0, rows = 0, hidden = 0;
};

// experts >= 1, 1 <= topk <= experts, capacity >= 0, pad_to_capacity only
// with a capacity.
absl::Status CheckMoeRouteOptions(const char* op, const MoeRouteOptions& o);

// logits [T, E]; expert and prob [T, K]; stats [2E + 1] (non-null outputs).
absl::StatusOr<MoeDims> CheckMoeRouteTopK(const char* op, const Tensor& logits,
                                          const MoeRouteOptions& o, const Tensor* expert,
                                          const Tensor* prob, const Tensor* stats);

// expert, prob and row [T, K]; row_token [N].
absl::StatusOr<MoeDims> CheckMoeRouteLayout(const char* op, const Tensor& expert,
                                            const Tensor& prob, const MoeRouteOptions& o,
                                            const Tensor* row, const Tensor* row_token);

// x [T, h]; row_token [N]; out [N, h].
absl::StatusOr<MoeDims> CheckMoePermute(const char* op, const Tensor& x, const Tensor& row_token,
                                        const Tensor* out);

// drows [N, h]; row [T, K]; dx [T, h].
absl::StatusOr<MoeDims> CheckMoePermuteBackward(const char* op, const Tensor& drows,
                                                const Tensor& row, const Tensor* dx);

// rows [N, h]; prob and row [T, K]; `tokens` (y or dy) [T, h].
absl::StatusOr<MoeDims> CheckMoeCombine(const char* op, const Tensor& rows, const Tensor& prob,
                                        const Tensor& row, const char* tokens_name,
                                        const Tensor* tokens);

// As CheckMoeCombine for dy, and drows [N, h], dprob [T, K].
absl::StatusOr<MoeDims> CheckMoeCombineBackward(const char* op, const Tensor& dy,
                                                const Tensor& rows, const Tensor& prob,
                                                const Tensor& row, const Tensor* drows,
                                                const Tensor* dprob);

// logits and dlogits [T, E]; expert, prob, dprob [T, K] with K <= E; with
// o.aux_loss aux_grad has E elements; z_scale finite.
absl::StatusOr<MoeDims> CheckMoeRouterBackward(const char* op, const Tensor& logits,
                                               const Tensor& expert, const Tensor& prob,
                                               const Tensor& dprob, const Tensor& aux_grad,
                                               const MoeRouterBackwardOptions& o,
                                               const Tensor* dlogits);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_MOE_CHECKS_H_
