#ifndef LOOM_CORE_CPU_SWIGLU_H_
#define LOOM_CORE_CPU_SWIGLU_H_

// SwiGLU, Megatron's fused activation of the gated MLP (Llama's
// down(silu(gate(x)) * up(x)) with gate and up as one [2F] projection):
// exactly Megatron's `x0, x1 = torch.chunk(x, 2, -1); silu(x0) * x1`.
// See elementwise.h for the backward conventions.

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// out[..., j] = silu(x[..., j]) * x[..., F + j], silu(g) = g / (1 + exp(-g)):
// the first half of the last dim is the gate, the second half the up
// projection.
//   x:   f32[..., 2F] with F > 0
//   out: f32[..., F] (x's leading dims)
absl::Status SwigluForward(const Tensor& x, Tensor* out);

// With s = sigmoid(g), g = x[..., j], u = x[..., F + j], d = dout[..., j]:
//   dx[..., j]     = d u s (1 + g (1 - s))   (silu'(g) = s (1 + g (1 - s)))
//   dx[..., F + j] = d silu(g)
//   dout: f32[..., F]
//   x:    f32[..., 2F] (the forward input)
//   dx:   f32[..., 2F] written (may alias x)
absl::Status SwigluBackward(const Tensor& dout, const Tensor& x, Tensor* dx);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_SWIGLU_H_
