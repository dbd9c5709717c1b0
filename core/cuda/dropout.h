#ifndef LOOM_CORE_CUDA_DROPOUT_H_
#define LOOM_CORE_CUDA_DROPOUT_H_

// GPU twin of core/cpu/dropout.h: the mask of every element is
// DropoutBitsAt(seed, offset, GLOBAL index) >= DropoutThreshold(p), bit for
// bit the CPU's (philox_device.h), so CPU and GPU ranks of any layout drop the
// same elements. x/out (dout/dx) are f32 or bf16, one dtype.

#include "absl/status/status.h"
#include "core/cpu/dropout.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   x, out: [..., C], same shape; in place allowed
//   mask: optional u8[same numel] (1 = kept)
absl::Status DropoutForward(const Tensor& x, Tensor* out, const cpu::DropoutOptions& opts,
                            const cpu::GlobalIndex& where = {}, Tensor* mask = nullptr);

//   dx = dout * keep / (1 - p), the mask regenerated; in place allowed
absl::Status DropoutBackward(const Tensor& dout, Tensor* dx, const cpu::DropoutOptions& opts,
                             const cpu::GlobalIndex& where = {});

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_DROPOUT_H_
