#ifndef LOOM_CORE_CUDA_ROPE_H_
#define LOOM_CORE_CUDA_ROPE_H_

// GPU twin of core/cpu/rope.h (same f32 angles, same options and checks):
// x/out (dout/dx) share one dtype, f32 or bf16, math in f32.

#include "absl/status/status.h"
#include "core/cpu/rope.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   x, out: [S, B, H, D], same shape; out may be x (in place)
absl::Status RopeForward(const Tensor& x, const cpu::RopeOptions& o, Tensor* out);
//   dout, dx: [S, B, H, D]; the inverse rotation; dx may be dout
absl::Status RopeBackward(const Tensor& dout, const cpu::RopeOptions& o, Tensor* dx);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_ROPE_H_
