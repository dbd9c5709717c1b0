#ifndef LOOM_CORE_CPU_REDUCE_H_
#define LOOM_CORE_CPU_REDUCE_H_

// Whole-tensor reductions, accumulated in double (gradient-norm clipping sums
// the squares of every shard of every parameter). Blocks of 64K elements are
// summed in parallel and added in order: the same bits for any thread count,
// and on the AVX2 and AVX-512 paths.

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom::core::cpu {

//   x: f32[any]
absl::StatusOr<double> Sum(const Tensor& x);
absl::StatusOr<double> SumSquares(const Tensor& x);
// acc[0] += SumSquares(x); acc: f64[1] on the CPU (what a gradient norm
// sums run by run without waiting for a device per run).
absl::Status SumSquaresInto(const Tensor& x, Tensor* acc);
// sqrt(SumSquares(x)).
absl::StatusOr<double> L2Norm(const Tensor& x);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_REDUCE_H_
