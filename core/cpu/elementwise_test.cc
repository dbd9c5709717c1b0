#include "core/cpu/elementwise.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "core/cpu/vec_math.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

double GeluRef(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(BiasAddTest, ForwardMatchesReference) {
  const Tensor x = Random({3, 5, 17}, 1), bias = Random({17}, 2);
  Tensor out = Make({3, 5, 17});
  LOOM_ASSERT_OK(BiasAddForward(x, bias, &out));
  std::vector<double> want = ToDouble(x);
  for (size_t i = 0; i < want.size(); ++i) want[i] += bias.data<float>()[i % 17];
  EXPECT_LE(RelError(out, want), kFwdTol);
  // In place.
  Tensor y = Copy(x);
  LOOM_ASSERT_OK(BiasAddForward(y, bias, &y));
  EXPECT_LE(RelError(y, want), kFwdTol);
}

TEST(BiasAddTest, BackwardAccumulatesAndMatchesFiniteDifferences) {
  Tensor x = Random({6, 9}, 1), bias = Random({9}, 2);
  const Tensor w = Random({6, 9}, 3), dir = Random({9}, 4);
  Tensor out = Make({6, 9});
  auto loss = [&] {
    EXPECT_TRUE(BiasAddForward(x, bias, &out).ok());
    return Dot(out, w);
  };
  Tensor dbias = Random({9}, 5);
  const std::vector<double> before = ToDouble(dbias);
  LOOM_ASSERT_OK(BiasAddBackward(w, &dbias));
  std::vector<double> grad = ToDouble(dbias);
  for (int j = 0; j < 9; ++j) grad[j] -= before[j];
  const double fd = DirectionalDerivative(bias, dir, kFdEps, loss);
  EXPECT_NEAR(Dot(grad, dir), fd, kGradTol * std::fabs(fd));
  // Exact column sums (reference in double).
  for (int j = 0; j < 9; ++j) {
    double s = 0;
    for (int r = 0; r < 6; ++r) s += w.data<float>()[r * 9 + j];
    EXPECT_NEAR(grad[j], s, 1e-5);
  }
}

TEST(GeluTest, ForwardMatchesTanhFormula) {
  Tensor x = Random({1000}, 1, -8.0f, 8.0f);
  // Include edge values: 0, tiny, large magnitudes.
  float* p = x.data<float>();
  p[0] = 0.0f;
  p[1] = 1e-20f;
  p[2] = -1e-20f;
  p[3] = 30.0f;
  p[4] = -30.0f;
  p[5] = 100.0f;
  Tensor out = Make({1000});
  LOOM_ASSERT_OK(GeluForward(x, &out));
  for (int64_t i = 0; i < 1000; ++i) {
    const double want = GeluRef(p[i]);
    EXPECT_NEAR(out.data<float>()[i], want, 1e-6 * std::max(1.0, std::fabs(want))) << p[i];
  }
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  Tensor x = Random({4, 33}, 1, -3.0f, 3.0f);
  const Tensor w = Random({4, 33}, 2), dir = Random({4, 33}, 3);
  Tensor out = Make({4, 33}), dx = Make({4, 33});
  auto loss = [&] {
    EXPECT_TRUE(GeluForward(x, &out).ok());
    return Dot(out, w);
  };
  LOOM_ASSERT_OK(GeluBackward(x, w, &dx));
  const double fd = DirectionalDerivative(x, dir, kFdEps, loss);
  EXPECT_NEAR(Dot(dx, dir), fd, kGradTol * std::fabs(fd));
  // Per element against the analytic derivative in double.
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<float>()[i], h = 1e-5;
    const double d = (GeluRef(v + h) - GeluRef(v - h)) / (2 * h);
    EXPECT_NEAR(dx.data<float>()[i], d * w.data<float>()[i], 1e-5) << v;
  }
}

TEST(AddScaleTest, MatchReference) {
  const Tensor a = Random({7, 11}, 1), b = Random({7, 11}, 2);
  Tensor out = Make({7, 11});
  LOOM_ASSERT_OK(Add(a, b, &out));
  std::vector<double> want = ToDouble(a);
  for (size_t i = 0; i < want.size(); ++i) want[i] += b.data<float>()[i];
  EXPECT_LE(RelError(out, want), kFwdTol);
  LOOM_ASSERT_OK(Scale(-0.5f, &out));
  for (double& v : want) v *= -0.5;
  EXPECT_LE(RelError(out, want), kFwdTol);
}

TEST(ZeroTest, ClearsSmallAndBlockedBuffers) {
  // 5 floats (one memset) and 5M + 3 floats (parallel 1 MiB blocks, ragged end).
  for (int64_t n : {int64_t{5}, int64_t{5 * 1024 * 1024 + 3}}) {
    Tensor t = Random({n}, 3);
    LOOM_ASSERT_OK(Zero(&t));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(t.data<float>()[i], 0.0f) << "n " << n << " at " << i;
  }
  EXPECT_FALSE(Zero(nullptr).ok());
}

TEST(ZeroTest, StreamedStoresStayInsideAMisalignedView) {
  // Large buffers are cleared with 32-byte non-temporal stores: a view that
  // starts and ends off that alignment is cleared exactly, its neighbours kept.
  const int64_t n = 6 * 1024 * 1024 + 13;
  Tensor whole = Random({n}, 4, 0.5f, 1.0f);
  for (int64_t offset : {int64_t{1}, int64_t{3}, int64_t{7}}) {
    const int64_t len = n - offset - 5;
    Tensor view = *whole.View(offset, Shape{len});
    LOOM_ASSERT_OK(Zero(&view));
    const float* p = whole.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const bool inside = i >= offset && i < offset + len;
      ASSERT_EQ(p[i] == 0.0f, inside) << "offset " << offset << " at " << i;
    }
    whole = Random({n}, 5 + offset, 0.5f, 1.0f);
  }
}

TEST(DispatchTest, PathMatchesEnvironment) {
  const char* off = std::getenv("LOOM_CPU_NO_AVX512");
  if (off != nullptr && std::string(off) == "1") {
    EXPECT_FALSE(internal::UseAvx512());
  } else {
    std::printf("AVX-512 path: %s\n", internal::UseAvx512() ? "yes" : "no (CPU lacks it)");
  }
}

TEST(ElementwiseTest, ErrorsNameOpAndShapes) {
  Tensor out = Make({3, 4});
  EXPECT_TRUE(IsInvalidArgument(BiasAddForward(Make({3, 4}), Make({5}), &out),
                                {"BiasAddForward", "[3, 4]", "f32[5] cpu", "last dim"}));
  Tensor small = Make({2, 4});
  EXPECT_TRUE(IsInvalidArgument(BiasAddForward(Make({3, 4}), Make({4}), &small),
                                {"BiasAddForward", "out", "[2, 4]"}));
  Tensor db = Make({5});
  EXPECT_TRUE(IsInvalidArgument(BiasAddBackward(Make({3, 4}), &db), {"BiasAddBackward"}));
  EXPECT_TRUE(IsInvalidArgument(GeluForward(Make({3, 4}, DType::kBF16), &out),
                                {"GeluForward", "bf16", "expected dtype f32"}));
  Tensor dx = Make({4, 3});
  EXPECT_TRUE(IsInvalidArgument(GeluBackward(Make({3, 4}), Make({3, 4}), &dx),
                                {"GeluBackward", "[3, 4]", "[4, 3]"}));
  EXPECT_TRUE(IsInvalidArgument(Add(Make({3, 4}), Make({3, 5}), &out), {"Add", "[3, 5]"}));
  EXPECT_TRUE(IsInvalidArgument(Scale(2.0f, nullptr), {"Scale", "null"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
