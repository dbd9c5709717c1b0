#ifndef LOOM_CORE_CPU_REDUCE_H_
#define LOOM_CORE_CPU_REDUCE_H_

// Whole-tensor reductions, accumulated in double (gradient-norm clipping sums
// the squares of every shard of every parameter).

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom::core::cpu {

//   x: f32[any]
absl::StatusOr<double> Sum(const Tensor& x);
absl::StatusOr<double> SumSquares(const Tensor& x);
// sqrt(SumSquares(x)).
absl::StatusOr<double> L2Norm(const Tensor& x);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_REDUCE_H_
