#ifndef LOOM_CORE_CPU_SOFTMAX_H_
#define LOOM_CORE_CPU_SOFTMAX_H_

// Row-wise softmax over the last dimension.

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// out[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max)).
//   x, out: f32[..., C], same shape. In-place allowed.
absl::Status SoftmaxForward(const Tensor& x, Tensor* out);

// dx = out * (dout - sum(dout * out)) row-wise.
//   out:  f32[..., C] (the forward output)
//   dout: f32[..., C]
//   dx:   f32[..., C] written (may alias dout)
absl::Status SoftmaxBackward(const Tensor& out, const Tensor& dout, Tensor* dx);

namespace internal {
// One row, in place allowed: y[0:n] = softmax(scale * x[0:n]), scale > 0.
void SoftmaxRow(const float* x, float* y, int64_t n, float scale);
}  // namespace internal

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_SOFTMAX_H_
