#ifndef LOOM_CORE_CPU_TEST_UTIL_H_
#define LOOM_CORE_CPU_TEST_UTIL_H_

// Helpers for the kernel tests: random tensors, double-precision comparisons
// and central finite differences of a scalar loss.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

#define LOOM_ASSERT_OK(expr)                                    \
  do {                                                          \
    const ::absl::Status _st = (expr);                          \
    ASSERT_TRUE(_st.ok()) << #expr << " -> " << _st.ToString(); \
  } while (0)

namespace loom::core::cpu::testing {

// A tensor that must allocate (aborts the test binary otherwise).
Tensor Make(const Shape& shape, DType dtype = DType::kF32);
// f32 with elements uniform in [lo, hi), reproducible from `seed`.
Tensor Random(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
// f32 with the given values (numel must match).
Tensor FromValues(const Shape& shape, const std::vector<float>& values);
// i32 or i64 (`dtype`) with the given ids or targets (numel must match).
Tensor Ids(const Shape& shape, DType dtype, const std::vector<int64_t>& values);
Tensor Copy(const Tensor& t);
std::vector<double> ToDouble(const Tensor& t);

// max |got - want| / max |want|: the error relative to the largest reference
// magnitude (robust when single references are near 0). A NaN anywhere in got
// or want, or a size mismatch, gives infinity.
double RelError(const Tensor& got, const std::vector<double>& want);
double RelError(const std::vector<double>& got, const std::vector<double>& want);

// sum(a * b) in double.
double Dot(const Tensor& a, const Tensor& b);
double Dot(const std::vector<double>& a, const Tensor& b);

// Central difference (L(x + eps d) - L(x - eps d)) / (2 eps) of loss() along
// direction d, perturbing x in place (restored afterwards).
double DirectionalDerivative(Tensor& x, const Tensor& d, double eps,
                             const std::function<double()>& loss);

// Checks `status` is InvalidArgument whose message contains every `needle`.
::testing::AssertionResult IsInvalidArgument(const absl::Status& status,
                                             const std::vector<std::string>& needles);

}  // namespace loom::core::cpu::testing

#endif  // LOOM_CORE_CPU_TEST_UTIL_H_
