#ifndef LOOM_CORE_CUDA_CONVERT_H_
#define LOOM_CORE_CUDA_CONVERT_H_

// GPU twin of core/cpu/convert.h: f32 <-> bf16, f32 <-> f16 and same-dtype
// copies, rounding to nearest even exactly as the CPU: bit-identical for
// every finite value and for bf16 NaN payloads; an f16 NaN comes out as the
// canonical NaN (the CPU's F16C keeps sign and payload). Asynchronous on the
// current stream.

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   src: [any]; dst: same numel (shapes may differ), the target dtype
absl::Status Convert(const Tensor& src, Tensor* dst);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_CONVERT_H_
