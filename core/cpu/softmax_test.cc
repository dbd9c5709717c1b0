#include "core/cpu/softmax.h"

#include <cmath>
#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

std::vector<double> RefSoftmax(const Tensor& x) {
  const int64_t c = x.dim(x.rank() - 1), rows = x.numel() / c;
  std::vector<double> px = ToDouble(x), out(x.numel());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, px[r * c + j]);
    for (int64_t j = 0; j < c; ++j) sum += std::exp(px[r * c + j] - mx);
    for (int64_t j = 0; j < c; ++j) out[r * c + j] = std::exp(px[r * c + j] - mx) / sum;
  }
  return out;
}

TEST(SoftmaxTest, ForwardMatchesDoubleReference) {
  Tensor x = Random({2, 7, 1001}, 1, -20.0f, 20.0f);
  x.data<float>()[5] = 80.0f;    // large: no overflow (max subtracted)
  x.data<float>()[6] = -200.0f;  // underflows to ~0
  Tensor out = Make({2, 7, 1001});
  LOOM_ASSERT_OK(SoftmaxForward(x, &out));
  const std::vector<double> want = RefSoftmax(x);
  // Per-element relative error (probabilities span many orders of magnitude).
  for (int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_NEAR(out.data<float>()[i], want[i], kFwdTol * want[i] + 1e-30) << i;
  }
  // In place.
  LOOM_ASSERT_OK(SoftmaxForward(x, &x));
  EXPECT_LE(RelError(x, want), kFwdTol);
}

TEST(SoftmaxTest, BackwardMatchesFiniteDifferences) {
  Tensor x = Random({3, 17}, 1, -3.0f, 3.0f);
  const Tensor w = Random({3, 17}, 2);
  Tensor out = Make({3, 17}), dx = Make({3, 17});
  auto loss = [&] {
    EXPECT_TRUE(SoftmaxForward(x, &out).ok());
    return Dot(out, w);
  };
  loss();
  LOOM_ASSERT_OK(SoftmaxBackward(out, w, &dx));
  for (uint64_t seed : {3, 4, 5}) {
    const Tensor dir = Random({3, 17}, seed);
    const double fd = DirectionalDerivative(x, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dx, dir), fd, kGradTol * std::fabs(fd) + 1e-5);
  }
}

TEST(SoftmaxTest, ErrorsNameOpAndShapes) {
  Tensor out = Make({3, 4});
  EXPECT_TRUE(IsInvalidArgument(SoftmaxForward(Make({4, 3}), &out),
                                {"SoftmaxForward", "[4, 3]", "[3, 4]"}));
  Tensor empty = Make({3, 0});
  EXPECT_TRUE(IsInvalidArgument(SoftmaxForward(Make({3, 0}), &empty), {"SoftmaxForward", "empty"}));
  EXPECT_TRUE(IsInvalidArgument(SoftmaxBackward(Make({3, 4}), Make({3, 4}, DType::kI64), &out),
                                {"SoftmaxBackward", "dout", "i64"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
