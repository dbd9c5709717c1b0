#include "core/cpu/rope.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// Hugging Face's f32 inverse frequency: 1.0 / (base ** (arange(0, r, 2).float() / r)).
float HfInvFreq(float base, int64_t r, int64_t i) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(r);
  return 1.0f / static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
}

// The angle of pair i at position p: HF's f32 product, or exact (double).
double Theta(const RopeOptions& o, int64_t r, int64_t p, int64_t i, bool hf_f32) {
  if (hf_f32) return static_cast<float>(p) * HfInvFreq(o.base, r, i);
  return static_cast<double>(p) * std::pow(static_cast<double>(o.base), -2.0 * i / r);
}

// x [S, B, H, D] rotated by sign * theta, in double.
std::vector<double> Reference(const Tensor& x, const RopeOptions& o, double sign,
                              bool hf_f32 = true) {
  const int64_t seq = x.dim(0), heads = x.dim(1) * x.dim(2), d = x.dim(3);
  const int64_t r = o.rotary_dim == 0 ? d : o.rotary_dim, h = r / 2;
  std::vector<double> px = ToDouble(x), out = px;
  for (int64_t s = 0; s < seq; ++s) {
    for (int64_t i = 0; i < h; ++i) {
      const double theta = Theta(o, r, s + o.position_offset, i, hf_f32);
      const double c = std::cos(theta), sn = sign * std::sin(theta);
      for (int64_t row = s * heads; row < (s + 1) * heads; ++row) {
        const double x0 = px[row * d + i], x1 = px[row * d + i + h];
        out[row * d + i] = x0 * c - x1 * sn;
        out[row * d + i + h] = x1 * c + x0 * sn;
      }
    }
  }
  return out;
}

// |a - b| in units in the last place of b.
double UlpDiff(float a, float b) {
  const float ulp = std::nextafter(std::fabs(b), INFINITY) - std::fabs(b);
  return std::fabs(static_cast<double>(a) - b) / ulp;
}

TEST(RopeTest, AnglesAreF32ThetaWithCorrectlyRoundedCosSin) {
  for (const float base : {10000.0f, 500000.0f}) {
    const int64_t r = 128, h = r / 2;
    std::vector<float> inv(h), cs(h), sn(h);
    internal::RopeInvFreq(base, r, inv.data());
    for (int64_t i = 0; i < h; ++i) {
      // Two roundings (the power, then 1 / it) from the exact base^(-2i/r).
      const double e = static_cast<float>(2 * i) / static_cast<float>(r);
      EXPECT_LE(UlpDiff(inv[i], static_cast<float>(std::pow(double{base}, -e))), 2.0) << i;
    }
    int64_t exact = 0, total = 0;
    for (const int64_t p :
         {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100}, int64_t{4095}, int64_t{8191},
          int64_t{131071}, int64_t{1} << 20, (int64_t{1} << 24) - 1}) {
      internal::RopeCosSin(p, inv.data(), h, cs.data(), sn.data());
      for (int64_t i = 0; i < h; ++i) {
        const double theta = static_cast<float>(p) * inv[i];  // the f32 product, exactly
        const float want_c = static_cast<float>(std::cos(theta));
        const float want_s = static_cast<float>(std::sin(theta));
        EXPECT_LE(UlpDiff(cs[i], want_c), 1.0) << "p=" << p << " i=" << i;
        EXPECT_LE(UlpDiff(sn[i], want_s), 1.0) << "p=" << p << " i=" << i;
        exact += (cs[i] == want_c) + (sn[i] == want_s);
        total += 2;
      }
    }
    EXPECT_GE(exact, total - 2) << "cos/sin should be the correctly rounded f32 values";
  }
}

TEST(RopeTest, ForwardMatchesDoubleReference) {
  // Llama's head dim 128, and 64 with base 500000 (Llama 3) and an offset.
  struct Case {
    Shape shape;
    RopeOptions o;
  };
  const Case cases[] = {
      {Shape{9, 2, 3, 128}, {}}, {Shape{5, 1, 4, 64}, {500000.0f, 0, 37}}, {Shape{3, 2, 1, 6}, {}}};
  for (const Case& c : cases) {
    const Tensor x = Random(c.shape, 1, -2.0f, 2.0f);
    Tensor out = Make(c.shape);
    LOOM_ASSERT_OK(RopeForward(x, c.o, &out));
    EXPECT_LE(RelError(out, Reference(x, c.o, 1.0)), kFwdTol) << c.shape.ToString();
    // At these positions the f32 angle is within 1e-5 of the exact one too.
    EXPECT_LE(RelError(out, Reference(x, c.o, 1.0, /*hf_f32=*/false)), 1e-5);
  }
}

TEST(RopeTest, PartialRotaryDimPassesTheRestThrough) {
  const Shape shape{6, 2, 3, 40};
  const Tensor x = Random(shape, 2);
  RopeOptions o;
  o.rotary_dim = 16;
  Tensor out = Make(shape);
  LOOM_ASSERT_OK(RopeForward(x, o, &out));
  EXPECT_LE(RelError(out, Reference(x, o, 1.0)), kFwdTol);
  for (int64_t row = 0; row < 6 * 2 * 3; ++row) {
    EXPECT_EQ(std::memcmp(out.data<float>() + row * 40 + 16, x.data<float>() + row * 40 + 16,
                          24 * sizeof(float)),
              0)
        << "row " << row;
  }
  Tensor dx = Make(shape);
  LOOM_ASSERT_OK(RopeBackward(x, o, &dx));
  EXPECT_LE(RelError(dx, Reference(x, o, -1.0)), kFwdTol);
  EXPECT_EQ(std::memcmp(dx.data<float>() + 16, x.data<float>() + 16, 24 * sizeof(float)), 0);
}

TEST(RopeTest, PositionOffsetContinuesTheSequence) {
  // Rows [11, 16) of a 16-position run == a 5-position run at offset 11.
  const int64_t b = 2, heads = 3, d = 32, per_s = b * heads * d;
  const Tensor whole = Random({16, b, heads, d}, 3);
  Tensor tail = Make({5, b, heads, d});
  std::memcpy(tail.data<float>(), whole.data<float>() + 11 * per_s, tail.nbytes());
  Tensor want = Make(whole.shape()), got = Make(tail.shape());
  LOOM_ASSERT_OK(RopeForward(whole, {}, &want));
  RopeOptions o;
  o.position_offset = 11;
  LOOM_ASSERT_OK(RopeForward(tail, o, &got));
  EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>() + 11 * per_s, got.nbytes()), 0);
  EXPECT_LE(RelError(got, Reference(tail, o, 1.0)), kFwdTol);
}

// Far into a long context the f32 angle (what HF computes) and the exact one
// differ by up to p 2^-24 radians: the kernel follows HF.
TEST(RopeTest, LargePositionsFollowHuggingFaceF32Angles) {
  const Shape shape{4, 1, 2, 128};
  const Tensor x = Random(shape, 4);
  RopeOptions o;
  o.position_offset = 1000000;
  Tensor out = Make(shape);
  LOOM_ASSERT_OK(RopeForward(x, o, &out));
  EXPECT_LE(RelError(out, Reference(x, o, 1.0)), kFwdTol);
  EXPECT_GT(RelError(out, Reference(x, o, 1.0, /*hf_f32=*/false)), 1e-3);
}

TEST(RopeTest, BackwardMatchesFiniteDifferencesAndInvertsForward) {
  const Shape shape{5, 2, 2, 12};
  RopeOptions o;
  o.rotary_dim = 8;
  o.position_offset = 3;
  Tensor x = Random(shape, 5);
  const Tensor w = Random(shape, 6);
  Tensor out = Make(shape);
  auto loss = [&] {
    EXPECT_TRUE(RopeForward(x, o, &out).ok());
    return Dot(out, w);
  };
  Tensor dx = Make(shape);
  LOOM_ASSERT_OK(RopeBackward(w, o, &dx));
  EXPECT_LE(RelError(dx, Reference(w, o, -1.0)), kFwdTol);
  for (uint64_t seed : {11, 12, 13}) {
    const Tensor dir = Random(shape, seed);
    const double fd = DirectionalDerivative(x, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dx, dir), fd, kGradTol * std::fabs(fd) + 1e-4);
  }
  // Backward(Forward(x)) == x up to rounding: the rotation is orthogonal.
  LOOM_ASSERT_OK(RopeForward(x, o, &out));
  Tensor back = Make(shape);
  LOOM_ASSERT_OK(RopeBackward(out, o, &back));
  EXPECT_LE(RelError(back, ToDouble(x)), kFwdTol);
}

TEST(RopeTest, InPlaceMatchesOutOfPlace) {
  const Shape shape{7, 3, 2, 24};
  for (const int64_t rotary_dim : {int64_t{0}, int64_t{10}}) {
    RopeOptions o;
    o.rotary_dim = rotary_dim;
    const Tensor x = Random(shape, 7);
    Tensor want = Make(shape), want_back = Make(shape);
    LOOM_ASSERT_OK(RopeForward(x, o, &want));
    LOOM_ASSERT_OK(RopeBackward(x, o, &want_back));
    Tensor y = Copy(x), z = Copy(x);
    LOOM_ASSERT_OK(RopeForward(y, o, &y));
    LOOM_ASSERT_OK(RopeBackward(z, o, &z));
    EXPECT_EQ(std::memcmp(y.raw_data(), want.raw_data(), want.nbytes()), 0) << rotary_dim;
    EXPECT_EQ(std::memcmp(z.raw_data(), want_back.raw_data(), want.nbytes()), 0) << rotary_dim;
  }
}

TEST(RopeTest, ErrorsNameOpAndArgument) {
  const Shape shape{2, 1, 2, 6};
  Tensor out = Make(shape);
  EXPECT_TRUE(IsInvalidArgument(RopeForward(Make({2, 2, 6}), {}, &out),
                                {"RopeForward", "x", "[2, 2, 6]", "[S, B, H, D]"}));
  RopeOptions o;
  o.rotary_dim = 8;
  EXPECT_TRUE(IsInvalidArgument(RopeForward(Make(shape), o, &out),
                                {"RopeForward", "rotary_dim is 8", "head dim 6"}));
  o.rotary_dim = 3;
  EXPECT_TRUE(IsInvalidArgument(RopeForward(Make(shape), o, &out), {"rotary_dim is 3", "even"}));
  o.rotary_dim = -2;
  EXPECT_TRUE(IsInvalidArgument(RopeForward(Make(shape), o, &out), {"rotary_dim is -2"}));
  Tensor odd = Make({2, 1, 2, 5});
  EXPECT_TRUE(IsInvalidArgument(RopeForward(Make({2, 1, 2, 5}), {}, &odd),
                                {"rotary_dim is 0", "even head dim"}));
  o = {};
  o.position_offset = -1;
  EXPECT_TRUE(IsInvalidArgument(RopeBackward(Make(shape), o, &out),
                                {"RopeBackward", "position_offset is -1"}));
  o = {};
  o.base = 0.0f;
  EXPECT_TRUE(IsInvalidArgument(RopeForward(Make(shape), o, &out), {"base is 0"}));
  Tensor wrong = Make({2, 1, 3, 6});
  EXPECT_TRUE(IsInvalidArgument(RopeForward(Make(shape), {}, &wrong),
                                {"RopeForward", "out", "[2, 1, 3, 6]"}));
  EXPECT_TRUE(
      IsInvalidArgument(RopeBackward(Make(shape), {}, nullptr), {"RopeBackward", "dx", "null"}));
  EXPECT_TRUE(IsInvalidArgument(RopeBackward(Make(shape, DType::kBF16), {}, &out),
                                {"RopeBackward", "dout", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
