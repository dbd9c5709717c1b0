#include "core/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

constexpr float kEps = 1e-6f;

// rstd and out = x rstd gamma of rows of c, in double.
void Reference(const Tensor& x, const Tensor& gamma, int64_t c, std::vector<double>* out,
               std::vector<double>* rstd) {
  const std::vector<double> px = ToDouble(x), pg = ToDouble(gamma);
  const int64_t n = x.numel() / c;
  out->assign(n * c, 0.0);
  rstd->assign(n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < c; ++j) ss += px[r * c + j] * px[r * c + j];
    const double s = 1.0 / std::sqrt(ss / c + kEps);
    for (int64_t j = 0; j < c; ++j) (*out)[r * c + j] = px[r * c + j] * s * pg[j];
    (*rstd)[r] = s;
  }
}

TEST(RmsNormTest, ForwardMatchesDoubleReference) {
  // c = 4096 (Llama-7B's hidden), 771 (odd tail), 5 (shorter than a vector).
  for (const Shape& shape : {Shape{13, 4096}, Shape{3, 2, 771}, Shape{7, 5}}) {
    const int64_t c = shape.dim(shape.rank() - 1), n = shape.numel() / c;
    const Tensor x = Random(shape, 1, -2.0f, 3.0f), g = Random({c}, 2, 0.5f, 1.5f);
    Tensor out = Make(shape), rstd = Make({n});
    LOOM_ASSERT_OK(RmsNormForward(x, g, kEps, &out, &rstd));
    std::vector<double> want, want_rstd;
    Reference(x, g, c, &want, &want_rstd);
    EXPECT_LE(RelError(out, want), kFwdTol) << shape.ToString();
    EXPECT_LE(RelError(rstd, want_rstd), kFwdTol) << shape.ToString();
  }
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 5, c = 24;
  Tensor x = Random({n, c}, 1, -2.0f, 2.0f), g = Random({c}, 2);
  const Tensor w = Random({n, c}, 4);
  Tensor out = Make({n, c}), rstd = Make({n});
  auto loss = [&] {
    EXPECT_TRUE(RmsNormForward(x, g, kEps, &out, &rstd).ok());
    return Dot(out, w);
  };
  loss();
  Tensor dx = Make({n, c});
  Tensor dg = Random({c}, 7);  // accumulated into
  const std::vector<double> dg0 = ToDouble(dg);
  LOOM_ASSERT_OK(RmsNormBackward(w, x, g, rstd, &dx, &dg));
  std::vector<double> dgv = ToDouble(dg);
  for (int64_t j = 0; j < c; ++j) dgv[j] -= dg0[j];
  for (uint64_t seed : {11, 12, 13}) {
    const Tensor dir_x = Random({n, c}, seed), dir_g = Random({c}, seed + 100);
    const double fd_x = DirectionalDerivative(x, dir_x, kFdEps, loss);
    EXPECT_NEAR(Dot(dx, dir_x), fd_x, kGradTol * std::fabs(fd_x) + 1e-4);
    const double fd_g = DirectionalDerivative(g, dir_g, kFdEps, loss);
    EXPECT_NEAR(Dot(dgv, dir_g), fd_g, kGradTol * std::fabs(fd_g) + 1e-4);
  }
}

// dx and dgamma against the formulas in double, on many rows (several
// threads' partial dgamma rows), with dx written in place over dout.
TEST(RmsNormTest, BackwardMatchesDoubleReferenceInPlace) {
  const int64_t n = 301, c = 131;
  const Tensor x = Random({n, c}, 1, -2.0f, 2.0f), g = Random({c}, 2), dout = Random({n, c}, 3);
  Tensor out = Make({n, c}), rstd = Make({n});
  LOOM_ASSERT_OK(RmsNormForward(x, g, kEps, &out, &rstd));
  const std::vector<double> px = ToDouble(x), pg = ToDouble(g), pd = ToDouble(dout);
  const std::vector<double> dg0 = ToDouble(Random({c}, 4));
  std::vector<double> want_dx(n * c), want_dg = dg0;
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < c; ++j) ss += px[r * c + j] * px[r * c + j];
    const double s = 1.0 / std::sqrt(ss / c + kEps);
    for (int64_t j = 0; j < c; ++j) dot += pg[j] * pd[r * c + j] * px[r * c + j] * s;
    for (int64_t j = 0; j < c; ++j) {
      const double nj = px[r * c + j] * s;
      want_dx[r * c + j] = s * (pg[j] * pd[r * c + j] - nj * dot / c);
      want_dg[j] += pd[r * c + j] * nj;
    }
  }
  Tensor dx = Copy(dout), dg = Random({c}, 4);
  LOOM_ASSERT_OK(RmsNormBackward(dx, x, g, rstd, &dx, &dg));
  EXPECT_LE(RelError(dx, want_dx), kFwdTol);
  // dgamma sums 301 rows in f32 (per-thread partials): a longer sum than a row.
  EXPECT_LE(RelError(dg, want_dg), 2e-5);
}

TEST(RmsNormTest, ErrorsNameOpAndArgument) {
  Tensor out = Make({3, 4}), rstd = Make({3});
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(Make({3, 4}), Make({5}), kEps, &out, &rstd),
                                {"RmsNormForward", "gamma", "f32[5] cpu", "[3, 4]"}));
  Tensor rstd2 = Make({2});
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(Make({3, 4}), Make({4}), kEps, &out, &rstd2),
                                {"RmsNormForward", "rstd", "expected 3 elements"}));
  Tensor out2 = Make({4, 3});
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(Make({3, 4}), Make({4}), kEps, &out2, &rstd),
                                {"RmsNormForward", "out", "[4, 3]"}));
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(Make({3, 0}), Make({0}), kEps, &out, &rstd),
                                {"RmsNormForward", "empty last dim"}));
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(Make({3, 4}), Make({4}), kEps, nullptr, &rstd),
                                {"RmsNormForward", "out", "null"}));
  Tensor dx = Make({3, 4}), dg = Make({5});
  EXPECT_TRUE(
      IsInvalidArgument(RmsNormBackward(Make({3, 4}), Make({3, 4}), Make({4}), rstd, &dx, &dg),
                        {"RmsNormBackward", "dgamma", "[5]"}));
  Tensor dg4 = Make({4});
  EXPECT_TRUE(
      IsInvalidArgument(RmsNormBackward(Make({3, 5}), Make({3, 4}), Make({4}), rstd, &dx, &dg4),
                        {"RmsNormBackward", "dout", "[3, 5]"}));
  EXPECT_TRUE(
      IsInvalidArgument(RmsNormForward(Make({3, 4}, DType::kBF16), Make({4}), kEps, &out, &rstd),
                        {"RmsNormForward", "x", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
