#ifndef LOOM_CORE_OPS_CONTRACTS_RESIDUAL_NORM_CHECKS_H_
#define LOOM_CORE_OPS_CONTRACTS_RESIDUAL_NORM_CHECKS_H_

// The argument contract of ResidualNormForward / ResidualNormBackward
// (options.h: ResidualNormOptions), shared by every device so a bad argument
// gets the same InvalidArgument everywhere. Shapes and options only; dtypes
// and placement are each device's.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::ops {

// x, branch, resid and out [..., C] of one shape (resid, out not null);
// gamma [C] with C > 0; rstd one value per row. LayerNorm: beta [C] and mean
// (not null) one per row. RMSNorm: beta undefined and mean null. The dropout
// options as CheckDropoutArgs. Returns the row count.
absl::StatusOr<int64_t> CheckResidualNormForward(const char* op, const Tensor& x,
                                                 const Tensor& branch, const Tensor& gamma,
                                                 const Tensor& beta, const ResidualNormOptions& o,
                                                 const Tensor* resid, const Tensor* out,
                                                 const Tensor* mean, const Tensor* rstd);

// dout, dresid, resid and dx [..., C] of one shape (dx not null); dbranch
// null or that shape; gamma, mean, rstd as the forward (mean undefined for
// RMSNorm); dgamma [C] not null; dbeta [C] not null for LayerNorm, null for
// RMSNorm. Returns the row count.
absl::StatusOr<int64_t> CheckResidualNormBackward(const char* op, const Tensor& dout,
                                                  const Tensor& dresid, const Tensor& resid,
                                                  const Tensor& gamma, const Tensor& mean,
                                                  const Tensor& rstd, const ResidualNormOptions& o,
                                                  const Tensor* dx, const Tensor* dbranch,
                                                  const Tensor* dgamma, const Tensor* dbeta);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_RESIDUAL_NORM_CHECKS_H_
