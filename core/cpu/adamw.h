#ifndef LOOM_CORE_CPU_ADAMW_H_
#define LOOM_CORE_CPU_ADAMW_H_

// One AdamW step (Loshchilov & Hutter: decoupled weight decay) with bias
// correction, in place over fp32 params and moments.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::AdamWOptions;  // the contract's options (core/ops/contracts/options.h)

// For every element, with g = grad * grad_scale and t = step (1 for the first):
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p)
//   param, grad, m, v: f32, all with the same numel (any shapes); m, v start at 0
absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const AdamWOptions& opts);

// AdamWStep, then param_copy = bf16(param) rounded as Convert (and so
// ParamBuffer::SyncComputeCopy) rounds it: the mixed-precision compute copy
// of the same range. On the CPU these are the two passes of the unfused path
// (bitwise); a device may fuse them into one (core/cuda/adamw.h).
//   param_copy: bf16, same numel as param (ops::CheckParamCopy)
absl::Status AdamWStepWithCopy(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v,
                               int64_t step, const AdamWOptions& opts, Tensor* param_copy);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_ADAMW_H_
