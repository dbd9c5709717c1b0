#ifndef LOOM_CORE_CUDA_SWIGLU_H_
#define LOOM_CORE_CUDA_SWIGLU_H_

// GPU twin of core/cpu/swiglu.h: x, out, dout, dx share one dtype (f32 or
// bf16), math in f32.

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   x: [..., 2F] = [gate | up]; out: [..., F]
absl::Status SwigluForward(const Tensor& x, Tensor* out);
//   dout: [..., F]; x: [..., 2F]; dx: [..., 2F] written (may alias x)
absl::Status SwigluBackward(const Tensor& dout, const Tensor& x, Tensor* dx);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_SWIGLU_H_
