#include "core/cpu/linear.h"

#include "core/cpu/elementwise.h"
#include "core/cpu/matmul.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/status_macros.h"

namespace loom::core::cpu {

// Each is the layers' former unfused sequence, kernel for kernel (layers/linear.cc,
// ParallelMlp in layers/attention.cc): bitwise the same results.

absl::Status LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor* y,
                           Tensor* pre, const LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(ops::CheckLinearForward("LinearForward", x, w, bias, y, pre, opts));
  Tensor* z = opts.gelu ? pre : y;
  LOOM_RETURN_IF_ERROR(Matmul(x, w, z, MatmulOptions{false, true, 1.0f, 0.0f, opts.bf16}));
  LOOM_RETURN_IF_ERROR(BiasAddForward(*z, bias, z));
  if (opts.gelu) LOOM_RETURN_IF_ERROR(GeluForward(*pre, y));
  return absl::OkStatus();
}

absl::Status LinearBackwardData(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor* dx,
                                Tensor* dbias, const LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(
      ops::CheckLinearBackwardData("LinearBackwardData", dy, w, pre, dx, dbias, opts));
  LOOM_RETURN_IF_ERROR(Matmul(dy, w, dx, MatmulOptions{false, false, 1.0f, 0.0f, opts.bf16}));
  if (opts.gelu) LOOM_RETURN_IF_ERROR(GeluBackward(pre, *dx, dx));
  if (dbias != nullptr) LOOM_RETURN_IF_ERROR(BiasAddBackward(*dx, dbias));
  return absl::OkStatus();
}

absl::Status LinearBackwardWeight(const Tensor& dy, const Tensor& x, Tensor* dw, Tensor* dbias,
                                  const LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(
      ops::CheckLinearBackwardWeight("LinearBackwardWeight", dy, x, dw, dbias, opts));
  LOOM_RETURN_IF_ERROR(Matmul(dy, x, dw, MatmulOptions{true, false, 1.0f, 1.0f, opts.bf16}));
  if (dbias != nullptr) LOOM_RETURN_IF_ERROR(BiasAddBackward(dy, dbias));
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
