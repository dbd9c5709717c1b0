#ifndef LOOM_CORE_CUDA_ADAMW_H_
#define LOOM_CORE_CUDA_ADAMW_H_

// GPU twin of core/cpu/adamw.h: one fused AdamW step over f32 param, grad,
// m and v (same formula and bias correction). Asynchronous.

#include <cstdint>

#include "absl/status/status.h"
#include "core/cpu/adamw.h"
#include "core/tensor.h"

namespace loom::core::cuda {

absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const cpu::AdamWOptions& opts);

// The same, also writing param_bf16 = bf16(updated param) (round to nearest
// even) in the same pass: the compute copy of mixed-precision training.
//   param_bf16: bf16, same numel as param
absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const cpu::AdamWOptions& opts, Tensor* param_bf16);

// The op list's AdamWStepWithCopy (core/cpu/adamw.h): the overload above,
// one pass writing param and its bf16 compute copy. Runs in the optimizer
// only where core::ops::ChooseKernel("adamw", cuda) picks "fused_copy".
absl::Status AdamWStepWithCopy(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v,
                               int64_t step, const cpu::AdamWOptions& opts, Tensor* param_copy);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_ADAMW_H_
