#ifndef LOOM_CORE_CUDA_SOFTMAX_H_
#define LOOM_CORE_CUDA_SOFTMAX_H_

// GPU twin of core/cpu/softmax.h: row-wise softmax over the last dim, f32 or
// bf16 (one dtype for all arguments), math in f32.

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   x, out: [..., C], same shape. In place allowed.
absl::Status SoftmaxForward(const Tensor& x, Tensor* out);
//   dx = out * (dout - sum(dout * out)); dx may alias dout.
absl::Status SoftmaxBackward(const Tensor& out, const Tensor& dout, Tensor* dx);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_SOFTMAX_H_
