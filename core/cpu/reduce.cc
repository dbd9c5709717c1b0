#include "core/cpu/reduce.h"

#include <cmath>

#include "core/cpu/check.h"

namespace loom::core::cpu {
namespace {

// sum term(x[i]) over the f32 elements of x, in double.
template <typename Term>
absl::StatusOr<double> SumInDouble(const char* op, const Tensor& x, Term term) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput(op, "x", x));
  const int64_t n = x.numel();
  const float* p = x.data<float>();
  double total = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += term(static_cast<double>(p[i]));
  return total;
}

}  // namespace

absl::StatusOr<double> Sum(const Tensor& x) {
  return SumInDouble("Sum", x, [](double v) { return v; });
}

absl::StatusOr<double> SumSquares(const Tensor& x) {
  return SumInDouble("SumSquares", x, [](double v) { return v * v; });
}

absl::StatusOr<double> L2Norm(const Tensor& x) {
  LOOM_RETURN_IF_ERROR(internal::CheckInput("L2Norm", "x", x));
  absl::StatusOr<double> ss = SumSquares(x);
  if (!ss.ok()) return ss.status();
  return std::sqrt(*ss);
}

}  // namespace loom::core::cpu
