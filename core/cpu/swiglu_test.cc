#include "core/cpu/swiglu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// The shape of SwiGLU's output: the last dim halved.
Shape Halved(const Shape& shape) {
  int64_t dims[Shape::kMaxRank];
  for (int i = 0; i < shape.rank(); ++i) dims[i] = shape.dim(i);
  dims[shape.rank() - 1] /= 2;
  return *Shape::Make(dims, shape.rank());
}

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// out [rows, f] and dx [rows, 2f] of x [rows, 2f] (gate | up) and dout, in double.
void Reference(const Tensor& x, const Tensor& dout, int64_t f, std::vector<double>* out,
               std::vector<double>* dx) {
  const std::vector<double> px = ToDouble(x), pd = ToDouble(dout);
  const int64_t rows = x.numel() / (2 * f);
  out->assign(rows * f, 0.0);
  dx->assign(rows * 2 * f, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      const double g = px[r * 2 * f + j], u = px[r * 2 * f + f + j], d = pd[r * f + j];
      const double s = Sigmoid(g);
      (*out)[r * f + j] = g * s * u;
      (*dx)[r * 2 * f + j] = d * u * s * (1.0 + g * (1.0 - s));
      (*dx)[r * 2 * f + f + j] = d * g * s;
    }
  }
}

TEST(SwigluTest, ForwardAndBackwardMatchDoubleReference) {
  // f = 11008 (Llama-7B's FFN: several segments per row), odd f, a 1-D x.
  for (const Shape& shape : {Shape{3, 2 * 11008}, Shape{2, 5, 2 * 37}, Shape{2 * 3}}) {
    const int64_t f = shape.dim(shape.rank() - 1) / 2;
    const Shape half = Halved(shape);
    const Tensor x = Random(shape, 1, -8.0f, 8.0f), dout = Random(half, 2);
    Tensor out = Make(half), dx = Make(shape);
    LOOM_ASSERT_OK(SwigluForward(x, &out));
    LOOM_ASSERT_OK(SwigluBackward(dout, x, &dx));
    std::vector<double> want, want_dx;
    Reference(x, dout, f, &want, &want_dx);
    EXPECT_LE(RelError(out, want), kFwdTol) << shape.ToString();
    EXPECT_LE(RelError(dx, want_dx), kFwdTol) << shape.ToString();
  }
}

TEST(SwigluTest, SaturatedGates) {
  // silu(g) -> 0 for g << 0 and -> g for g >> 0, no NaN or Inf.
  const Tensor x = FromValues({2, 8}, {-200.0f, -90.0f, -20.0f, 0.0f, 1.5f, 1.5f, 1.5f, 1.5f, 20.0f,
                                       90.0f, 200.0f, 1.0f, -1.5f, -1.5f, -1.5f, -1.5f});
  const Tensor dout = FromValues({2, 4}, {1, 1, 1, 1, 1, 1, 1, 1});
  Tensor out = Make({2, 4}), dx = Make({2, 8});
  LOOM_ASSERT_OK(SwigluForward(x, &out));
  LOOM_ASSERT_OK(SwigluBackward(dout, x, &dx));
  std::vector<double> want, want_dx;
  Reference(x, dout, 4, &want, &want_dx);
  // Relative 2e-6 (ExpF's 2 ulp through the quotient), absolute 1e-30 where
  // exp(-g) saturates (silu(-200) is ~1e-85; the kernel's is ~1e-36).
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(out.data<float>()[i], want[i], 2e-6 * std::fabs(want[i]) + 1e-30) << i;
  }
  for (int64_t i = 0; i < 16; ++i) {
    EXPECT_NEAR(dx.data<float>()[i], want_dx[i], 2e-6 * std::fabs(want_dx[i]) + 1e-30) << i;
  }
}

TEST(SwigluTest, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, f = 9;
  Tensor x = Random({rows, 2 * f}, 3, -3.0f, 3.0f);
  const Tensor w = Random({rows, f}, 4);
  Tensor out = Make({rows, f});
  auto loss = [&] {
    EXPECT_TRUE(SwigluForward(x, &out).ok());
    return Dot(out, w);
  };
  Tensor dx = Make({rows, 2 * f});
  LOOM_ASSERT_OK(SwigluBackward(w, x, &dx));
  for (uint64_t seed : {11, 12, 13}) {
    const Tensor dir = Random({rows, 2 * f}, seed);
    const double fd = DirectionalDerivative(x, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dx, dir), fd, kGradTol * std::fabs(fd) + 1e-4);
  }
}

TEST(SwigluTest, BackwardInPlaceOverX) {
  const Tensor x = Random({33, 2 * 40}, 5, -4.0f, 4.0f), dout = Random({33, 40}, 6);
  Tensor want = Make({33, 80});
  LOOM_ASSERT_OK(SwigluBackward(dout, x, &want));
  Tensor dx = Copy(x);
  LOOM_ASSERT_OK(SwigluBackward(dout, dx, &dx));
  EXPECT_EQ(std::memcmp(dx.raw_data(), want.raw_data(), want.nbytes()), 0);
}

TEST(SwigluTest, ErrorsNameOpAndArgument) {
  Tensor out = Make({3, 4});
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(Make({3, 7}), &out),
                                {"SwigluForward", "x", "[3, 7]", "2F > 0"}));
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(Make({3, 0}), &out), {"SwigluForward", "2F > 0"}));
  Tensor out5 = Make({3, 5});
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(Make({3, 8}), &out5),
                                {"SwigluForward", "out", "[3, 5]", "halved (4)"}));
  Tensor out_rows = Make({2, 4});
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(Make({3, 8}), &out_rows), {"out", "[2, 4]"}));
  Tensor flat = Make({12});
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(Make({3, 8}), &flat), {"out", "[12]"}));
  Tensor dx = Make({3, 8});
  EXPECT_TRUE(IsInvalidArgument(SwigluBackward(Make({3, 8}), Make({3, 8}), &dx),
                                {"SwigluBackward", "dout", "[3, 8]"}));
  Tensor dx_bad = Make({3, 4});
  EXPECT_TRUE(IsInvalidArgument(SwigluBackward(Make({3, 4}), Make({3, 8}), &dx_bad),
                                {"SwigluBackward", "dx", "[3, 4]"}));
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(Make({3, 8}), nullptr), {"out", "null"}));
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(Make({3, 8}, DType::kBF16), &out),
                                {"SwigluForward", "x", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
