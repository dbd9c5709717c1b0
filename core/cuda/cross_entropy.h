#ifndef LOOM_CORE_CUDA_CROSS_ENTROPY_H_
#define LOOM_CORE_CUDA_CROSS_ENTROPY_H_

// GPU twin of core/cpu/cross_entropy.h. logits/dlogits are f32 or bf16 (one
// dtype); losses and lse are always f32; targets i32 or i64.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cpu/cross_entropy.h"
#include "core/tensor.h"

namespace loom::core::cuda {

// As the CPU: writes losses and lse, returns the mean loss over non-ignored
// tokens (summed in double). Synchronises the current stream (the result is a
// host number). A target outside [0, V) that is not ignore_index is an
// InvalidArgument naming it — detected on the device, so losses/lse have
// already been written when it is reported.
absl::StatusOr<double> CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                           Tensor* losses, Tensor* lse,
                                           const cpu::CrossEntropyOptions& opts = {});

// dlogits = (softmax - onehot) * dloss / count; dlogits may alias logits.
// Asynchronous: the count of non-ignored tokens is computed on the device.
// Targets are not range-checked here (that would need a host sync; the
// forward rejects them): an out-of-range target gives a NaN row.
absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  float dloss, Tensor* dlogits,
                                  const cpu::CrossEntropyOptions& opts = {});

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_CROSS_ENTROPY_H_
