#ifndef LOOM_CORE_CUDA_ELEMENTWISE_H_
#define LOOM_CORE_CUDA_ELEMENTWISE_H_

// GPU twins of core/cpu/elementwise.h (same names, arguments, in-place rules
// and gradient conventions). Tensors are f32 or bf16, all of one dtype,
// except that the accumulated dbias may be f32 for bf16 activations; math in
// f32. Asynchronous on the current stream.

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cuda {

// out[r, c] = x[r, c] + bias[c]. x: [..., C]; bias: [C]; out like x. In place allowed.
absl::Status BiasAddForward(const Tensor& x, const Tensor& bias, Tensor* out);
// dbias[c] += sum_r dout[r, c] (deterministic: fixed-order partial sums).
absl::Status BiasAddBackward(const Tensor& dout, Tensor* dbias);
// GELU, tanh approximation (GPT-2), the CPU's formula. In place allowed.
absl::Status GeluForward(const Tensor& x, Tensor* out);
// dx = dout * gelu'(x); dx may alias dout.
absl::Status GeluBackward(const Tensor& x, const Tensor& dout, Tensor* dx);
// out = a + b; out may alias a or b.
absl::Status Add(const Tensor& a, const Tensor& b, Tensor* out);
// x *= scale, in place.
absl::Status Scale(float scale, Tensor* x);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_ELEMENTWISE_H_
