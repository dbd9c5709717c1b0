#ifndef LOOM_CORE_CUDA_REDUCE_H_
#define LOOM_CORE_CUDA_REDUCE_H_

// GPU twin of core/cpu/reduce.h: whole-tensor sums of f32 or bf16 tensors,
// accumulated in double in a fixed order (deterministic). Each returns a
// host number, so it synchronises the current stream.

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom::core::cuda {

absl::StatusOr<double> Sum(const Tensor& x);
absl::StatusOr<double> SumSquares(const Tensor& x);
absl::StatusOr<double> L2Norm(const Tensor& x);  // sqrt(SumSquares(x))
// acc[0] += SumSquares(x) on the device (acc f64 [1] on x's device), queued
// on the current stream: no host wait.
absl::Status SumSquaresInto(const Tensor& x, Tensor* acc);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_REDUCE_H_
