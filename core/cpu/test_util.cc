#include "core/cpu/test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace loom::core::cpu::testing {

Tensor Make(const Shape& shape, DType dtype) {
  absl::StatusOr<Tensor> t = Tensor::Zeros(shape, dtype);
  if (!t.ok()) {
    std::fprintf(stderr, "test_util: %s\n", t.status().ToString().c_str());
    std::abort();
  }
  return *t;
}

Tensor Random(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = Make(shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

Tensor FromValues(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Make(shape);
  if (static_cast<int64_t>(values.size()) != t.numel()) std::abort();
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

Tensor Ids(const Shape& shape, DType dtype, const std::vector<int64_t>& values) {
  Tensor t = Make(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel()) std::abort();
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kI32) {
      t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    } else {
      t.data<int64_t>()[i] = values[i];
    }
  }
  return t;
}

Tensor Copy(const Tensor& t) {
  absl::StatusOr<Tensor> c = t.Clone();
  if (!c.ok()) std::abort();
  return *c;
}

std::vector<double> ToDouble(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<double>(p, p + t.numel());
}

double RelError(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double max_err = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]);
    if (!(e <= max_err)) max_err = std::isnan(e) ? INFINITY : e;  // a NaN sticks
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  return max_ref == 0.0 ? max_err : max_err / max_ref;
}

double RelError(const Tensor& got, const std::vector<double>& want) {
  return RelError(ToDouble(got), want);
}

double Dot(const std::vector<double>& a, const Tensor& b) {
  const float* pb = b.data<float>();
  double s = 0.0;
  for (int64_t i = 0; i < b.numel(); ++i) s += a[i] * pb[i];
  return s;
}

double Dot(const Tensor& a, const Tensor& b) { return Dot(ToDouble(a), b); }

double DirectionalDerivative(Tensor& x, const Tensor& d, double eps,
                             const std::function<double()>& loss) {
  const std::vector<double> x0 = ToDouble(x);
  float* px = x.data<float>();
  const float* pd = d.data<float>();
  auto set = [&](double h) {
    for (int64_t i = 0; i < x.numel(); ++i) px[i] = static_cast<float>(x0[i] + h * pd[i]);
  };
  set(eps);
  const double plus = loss();
  set(-eps);
  const double minus = loss();
  set(0.0);
  return (plus - minus) / (2.0 * eps);
}

::testing::AssertionResult IsInvalidArgument(const absl::Status& status,
                                             const std::vector<std::string>& needles) {
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "expected InvalidArgument, got " << status.ToString();
  }
  for (const std::string& n : needles) {
    if (status.message().find(n) == absl::string_view::npos) {
      return ::testing::AssertionFailure()
             << "message \"" << status.message() << "\" lacks \"" << n << "\"";
    }
  }
  return ::testing::AssertionSuccess() << status.message();
}

}  // namespace loom::core::cpu::testing
