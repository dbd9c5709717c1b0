#ifndef LOOM_CORE_CPU_ELEMENTWISE_H_
#define LOOM_CORE_CPU_ELEMENTWISE_H_

// Element-wise kernels of a GPT layer: bias, GELU, residual add, scaling.
//
// Conventions for every backward kernel in core/cpu: gradients of activations
// (dx) are overwritten; gradients of parameters (dbias, dgamma, dweight, ...)
// are accumulated (+=), so micro-batches can sum into one gradient buffer.
// In-place use (output == input) is allowed where a comment says so.

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// out[r, c] = x[r, c] + bias[c]. In-place (out == x) allowed.
//   x:    f32[..., C] (any rank >= 1; rows = numel / C)
//   bias: f32[C]
//   out:  f32[same as x]
absl::Status BiasAddForward(const Tensor& x, const Tensor& bias, Tensor* out);

// dbias[c] += sum_r dout[r, c].
//   dout:  f32[..., C]
//   dbias: f32[C] (accumulated)
absl::Status BiasAddBackward(const Tensor& dout, Tensor* dbias);

// GELU, tanh approximation (GPT-2):
//   out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   x, out: f32[any], same shape. In-place allowed.
absl::Status GeluForward(const Tensor& x, Tensor* out);

// dx = dout * gelu'(x).
//   x, dout, dx: f32[any], same shape. dx may alias dout.
absl::Status GeluBackward(const Tensor& x, const Tensor& dout, Tensor* dx);

// out = a + b (the residual connection). out may alias a or b.
//   a, b, out: f32[any], same shape.
absl::Status Add(const Tensor& a, const Tensor& b, Tensor* out);

// x *= scale, in place (e.g. gradient clipping, loss scaling).
//   x: f32[any]
absl::Status Scale(float scale, Tensor* x);

// Sets every byte of t to zero (any dtype), with both threads: a gradient
// buffer of a 124M-parameter model is 0.5 GB, too much for one core's memset.
//   t: any defined CPU tensor.
absl::Status Zero(Tensor* t);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_ELEMENTWISE_H_
