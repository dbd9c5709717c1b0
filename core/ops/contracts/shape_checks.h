#ifndef LOOM_CORE_OPS_CONTRACTS_SHAPE_CHECKS_H_
#define LOOM_CORE_OPS_CONTRACTS_SHAPE_CHECKS_H_

// The kernels' shape contracts, shared by every device's implementation:
// core/ops owns the contracts (op_list.h) and each device checks the same
// ones, so a bad argument gets the same error on every device. (Checks of an
// option struct sit beside it in options.h; attention's whole contract is
// attention_checks.h.) Each failure is an InvalidArgument naming the op, the
// argument and its shape. Placement and dtype checks stay with each device.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::ops {

// `t` has exactly `numel` elements (`why` says what they are).
absl::Status CheckNumel(const char* op, const char* arg, const Tensor& t, int64_t numel,
                        const std::string& why);

// SumSquaresInto's accumulator: not null, f64, one element.
absl::Status CheckDoubleAccumulator(const char* op, const Tensor* acc);

// `t` has exactly the shape `want`.
absl::Status CheckShape(const char* op, const char* name, const Tensor& t, const Shape& want);

// `vec` is rank 1 and as long as x's last dim (a bias; LayerNorm's gamma, beta;
// RMSNorm's gamma).
absl::Status CheckLastDimVector(const char* op, const char* x_name, const Tensor& x,
                                const char* vec_name, const Tensor& vec);

// LayerNorm over the last dim C of x: gamma is [C] with C > 0, and mean and
// rstd hold one value per row of x. Returns the row count. (beta, out and the
// gradients are checked against gamma or x beside the call.)
absl::StatusOr<int64_t> CheckLayerNormRows(const char* op, const Tensor& x, const Tensor& gamma,
                                           const Tensor& mean, const Tensor& rstd);

// RMSNorm over the last dim C of x: gamma is [C] with C > 0, and rstd holds
// one value per row of x. Returns the row count.
absl::StatusOr<int64_t> CheckRmsNormRows(const char* op, const Tensor& x, const Tensor& gamma,
                                         const Tensor& rstd);

// The gradients of a norm over the last dim: dgamma has gamma's shape, dout
// and dx have x's (LayerNorm's dbeta is checked beside the call).
absl::Status CheckNormGradients(const char* op, const Tensor& x, const Tensor& gamma,
                                const Tensor& dout, const Tensor& dx, const Tensor& dgamma);

// SwiGLU's halves: x is [..., 2F] with F > 0, and `half` (its output or the
// output's gradient) is [..., F] with x's leading dims.
struct SwigluDims {
  int64_t rows, f;
};
absl::StatusOr<SwigluDims> CheckSwigluHalves(const char* op, const Tensor& x, const char* half_name,
                                             const Tensor& half);

// Logits [..., V] with V > 0 and one target per row; returns the row count.
absl::StatusOr<int64_t> CheckLogitsTargets(const char* op, const Tensor& logits,
                                           const Tensor& targets);

// AdamWStepWithCopy's compute copy: not null, bf16, as many elements as
// param (the copy of the same flat range).
absl::Status CheckParamCopy(const char* op, const Tensor& param, const Tensor* param_copy);

// The vocab-parallel cross-entropy's local logits [..., Vp > 0], a shard
// that fits them (vocab_start >= 0, valid in [0, Vp]) and, when `targets`
// is defined, one target per row. Returns the row count.
absl::StatusOr<int64_t> CheckVocabShardRows(const char* op, const Tensor& logits,
                                            const Tensor& targets, const VocabShard& shard);

// VocabShardRescaleSums's per-row arrays: local_max and max hold one value
// per row, sums is [2, rows] (2 * rows elements).
absl::Status CheckVocabRescaleArgs(const char* op, int64_t rows, const Tensor& local_max,
                                   const Tensor& max, const Tensor* sums);

// A linear layer's GEMMs (LinearForward, LinearBackwardData,
// LinearBackwardWeight): rank-2 x [N, K], w [M, K], y and dy [N, M], dx [N, K],
// dw [M, K].
// Forward: bias [M]; y non-null; with opts.gelu pre is non-null [N, M] and
// not y's storage, without it null.
absl::Status CheckLinearForward(const char* op, const Tensor& x, const Tensor& w,
                                const Tensor& bias, const Tensor* y, const Tensor* pre,
                                const LinearOptions& opts);
// BackwardData: with opts.gelu pre is [N, K]; dbias (null or [K]) needs opts.gelu.
absl::Status CheckLinearBackwardData(const char* op, const Tensor& dy, const Tensor& w,
                                     const Tensor& pre, const Tensor* dx, const Tensor* dbias,
                                     const LinearOptions& opts);
// BackwardWeight: dbias null or [M]; opts.gelu is refused (no activation here).
absl::Status CheckLinearBackwardWeight(const char* op, const Tensor& dy, const Tensor& x,
                                       const Tensor* dw, const Tensor* dbias,
                                       const LinearOptions& opts);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_SHAPE_CHECKS_H_
