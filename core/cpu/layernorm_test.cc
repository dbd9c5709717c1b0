#include "core/cpu/layernorm.h"

#include <cmath>
#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

constexpr float kEps = 1e-5f;

TEST(LayerNormTest, ForwardMatchesDoubleReference) {
  const int64_t n = 13, c = 768;
  const Tensor x = Random({n, c}, 1, -2.0f, 3.0f), g = Random({c}, 2), b = Random({c}, 3);
  Tensor out = Make({n, c}), mean = Make({n}), rstd = Make({n});
  LOOM_ASSERT_OK(LayerNormForward(x, g, b, kEps, &out, &mean, &rstd));
  std::vector<double> want(n * c), want_mean(n), want_rstd(n);
  const std::vector<double> px = ToDouble(x);
  for (int64_t r = 0; r < n; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < c; ++j) m += px[r * c + j];
    m /= c;
    for (int64_t j = 0; j < c; ++j) v += (px[r * c + j] - m) * (px[r * c + j] - m);
    const double s = 1.0 / std::sqrt(v / c + kEps);
    for (int64_t j = 0; j < c; ++j) {
      want[r * c + j] = (px[r * c + j] - m) * s * g.data<float>()[j] + b.data<float>()[j];
    }
    want_mean[r] = m;
    want_rstd[r] = s;
  }
  EXPECT_LE(RelError(out, want), kFwdTol);
  EXPECT_LE(RelError(mean, want_mean), kFwdTol);
  EXPECT_LE(RelError(rstd, want_rstd), kFwdTol);
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 5, c = 24;
  Tensor x = Random({n, c}, 1, -2.0f, 2.0f), g = Random({c}, 2), b = Random({c}, 3);
  const Tensor w = Random({n, c}, 4);
  Tensor out = Make({n, c}), mean = Make({n}), rstd = Make({n});
  auto loss = [&] {
    EXPECT_TRUE(LayerNormForward(x, g, b, kEps, &out, &mean, &rstd).ok());
    return Dot(out, w);
  };
  loss();
  Tensor dx = Make({n, c});
  Tensor dg = Random({c}, 7), db = Random({c}, 8);  // accumulated into
  const std::vector<double> dg0 = ToDouble(dg), db0 = ToDouble(db);
  LOOM_ASSERT_OK(LayerNormBackward(w, x, g, mean, rstd, &dx, &dg, &db));
  std::vector<double> dgv = ToDouble(dg), dbv = ToDouble(db);
  for (int64_t j = 0; j < c; ++j) {
    dgv[j] -= dg0[j];
    dbv[j] -= db0[j];
  }
  for (uint64_t seed : {11, 12, 13}) {
    const Tensor dir_x = Random({n, c}, seed), dir_p = Random({c}, seed + 100);
    const double fd_x = DirectionalDerivative(x, dir_x, kFdEps, loss);
    EXPECT_NEAR(Dot(dx, dir_x), fd_x, kGradTol * std::fabs(fd_x) + 1e-4);
    const double fd_g = DirectionalDerivative(g, dir_p, kFdEps, loss);
    EXPECT_NEAR(Dot(dgv, dir_p), fd_g, kGradTol * std::fabs(fd_g) + 1e-4);
    const double fd_b = DirectionalDerivative(b, dir_p, kFdEps, loss);
    EXPECT_NEAR(Dot(dbv, dir_p), fd_b, kGradTol * std::fabs(fd_b) + 1e-4);
  }
}

TEST(LayerNormTest, ErrorsNameOpAndShapes) {
  Tensor out = Make({3, 4}), mean = Make({3}), rstd = Make({3});
  EXPECT_TRUE(IsInvalidArgument(
      LayerNormForward(Make({3, 4}), Make({5}), Make({4}), kEps, &out, &mean, &rstd),
      {"LayerNormForward", "gamma", "f32[5] cpu", "[3, 4]"}));
  Tensor mean2 = Make({2});
  EXPECT_TRUE(IsInvalidArgument(
      LayerNormForward(Make({3, 4}), Make({4}), Make({4}), kEps, &out, &mean2, &rstd),
      {"LayerNormForward", "mean", "expected 3 elements"}));
  Tensor dx = Make({3, 4}), dg = Make({4}), db = Make({5});
  EXPECT_TRUE(IsInvalidArgument(
      LayerNormBackward(Make({3, 4}), Make({3, 4}), Make({4}), mean, rstd, &dx, &dg, &db),
      {"LayerNormBackward", "dbeta", "[5]"}));
  EXPECT_TRUE(IsInvalidArgument(
      LayerNormForward(Make({3, 4}, DType::kF16), Make({4}), Make({4}), kEps, &out, &mean, &rstd),
      {"LayerNormForward", "f16"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
