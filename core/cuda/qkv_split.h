#ifndef LOOM_CORE_CUDA_QKV_SPLIT_H_
#define LOOM_CORE_CUDA_QKV_SPLIT_H_

// GPU twin of core/cpu/qkv_split.h (same options and checks): both tensors
// share one dtype, f32 or bf16, math in f32 (the backward's k/v sums too, in
// head order, without atomics); RoPE's angles as core/cuda/rope.h's.

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   proj: [S, B, groups * (n + 2) * d]; qkv: [S, B, heads * 3 * d] (distinct storage)
absl::Status QkvSplitRopeForward(const Tensor& proj, const ops::QkvSplitOptions& o, Tensor* qkv);
//   dqkv: [S, B, heads * 3 * d]; dproj: [S, B, groups * (n + 2) * d], overwritten
absl::Status QkvSplitRopeBackward(const Tensor& dqkv, const ops::QkvSplitOptions& o,
                                  Tensor* dproj);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_QKV_SPLIT_H_
