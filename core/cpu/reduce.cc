#include "core/cpu/reduce.h"

#include <cmath>

#include "core/cpu/check.h"

namespace loom::core::cpu {

absl::StatusOr<double> Sum(const Tensor& x) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput("Sum", "x", x));
  const int64_t n = x.numel();
  const float* p = x.data<float>();
  double total = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += p[i];
  return total;
}

absl::StatusOr<double> SumSquares(const Tensor& x) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput("SumSquares", "x", x));
  const int64_t n = x.numel();
  const float* p = x.data<float>();
  double total = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) {
    const double v = p[i];
    total += v * v;
  }
  return total;
}

absl::StatusOr<double> L2Norm(const Tensor& x) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput("L2Norm", "x", x));
  absl::StatusOr<double> ss = SumSquares(x);
  if (!ss.ok()) return ss.status();
  return std::sqrt(*ss);
}

}  // namespace loom::core::cpu
