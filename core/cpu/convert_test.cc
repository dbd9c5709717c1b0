#include "core/cpu/convert.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round-to-nearest-even reference by exhaustive comparison in double:
// the nearest bf16 (ties to the even mantissa).
uint16_t RefBf16(float f) {
  if (std::isnan(f)) return static_cast<uint16_t>((Bits(f) >> 16) | 0x40);
  const uint32_t u = Bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation (toward zero)
  const uint16_t hi = static_cast<uint16_t>(lo + 1);   // next magnitude up
  const double d = std::fabs(static_cast<double>(f));
  const double dl = std::fabs(static_cast<double>(Bf16BitsToFloat(lo)));
  // Past the largest finite value, "hi" is Inf: IEEE rounding compares with
  // 2^128, the value it would have with an unbounded exponent.
  const double hv = std::fabs(static_cast<double>(Bf16BitsToFloat(hi)));
  const double dh = std::isinf(hv) ? std::ldexp(1.0, 128) : hv;
  if (d - dl < dh - d) return lo;
  if (d - dl > dh - d) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Bf16Test, EdgeCasesExact) {
  struct Case {
    uint32_t in;
    uint16_t want;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80, "1.0"},
      {0x3f808000, 0x3f80, "tie, even below: stays"},
      {0x3f818000, 0x3f82, "tie, odd below: rounds up to even"},
      {0x3f808001, 0x3f81, "just above the tie"},
      {0x3f807fff, 0x3f80, "just below the tie"},
      {0xbf818000, 0xbf82, "negative tie to even"},
      {0x7f800000, 0x7f80, "+Inf"},
      {0xff800000, 0xff80, "-Inf"},
      {0x7f7fffff, 0x7f80, "max finite f32 rounds to +Inf"},
      {0xff7fffff, 0xff80, "-max finite rounds to -Inf"},
      {0x7f7f7fff, 0x7f7f, "just below the bf16 max: stays finite"},
      {0x7f7f8000, 0x7f80, "tie above the bf16 max (odd): to Inf"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0"},
      {0x00000001, 0x0000, "smallest subnormal rounds to 0"},
      {0x00008000, 0x0000, "subnormal tie to even 0"},
      {0x00018000, 0x0002, "subnormal tie to even 2"},
      {0x00010001, 0x0001, "subnormal rounds down"},
      {0x007fffff, 0x0080, "largest subnormal rounds up to the smallest normal"},
      {0x7fc00000, 0x7fc0, "quiet NaN"},
      {0x7f800001, 0x7fc0, "signalling NaN with low payload: stays NaN, quiet"},
      {0xff810000, 0xffc1, "negative signalling NaN: quiet, sign kept"},
      {0x7fffffff, 0x7fff, "NaN with all-ones payload: no overflow into Inf/sign"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToBf16Bits(FromBits(c.in)), c.want) << c.what;
    EXPECT_EQ(RefBf16(FromBits(c.in)), c.want) << "reference: " << c.what;
  }
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(FromBits(0x7f800001)))));
}

TEST(Bf16Test, TensorConversionMatchesReferenceOnRandomBits) {
  const int64_t n = 100003;
  Tensor src = Make({n}), dst = Make({n}, DType::kBF16), back = Make({n});
  std::mt19937 rng(5);
  for (int64_t i = 0; i < n; ++i) src.data<float>()[i] = FromBits(rng());
  LOOM_ASSERT_OK(Convert(src, &dst));
  LOOM_ASSERT_OK(Convert(dst, &back));
  const uint16_t* b = reinterpret_cast<const uint16_t*>(dst.data<BFloat16>());
  for (int64_t i = 0; i < n; ++i) {
    const float f = src.data<float>()[i];
    ASSERT_EQ(b[i], RefBf16(f)) << std::hex << Bits(f);
    const uint32_t back_bits = Bits(back.data<float>()[i]);
    ASSERT_EQ(back_bits, static_cast<uint32_t>(b[i]) << 16);
  }
}

TEST(F16Test, EdgeCasesExact) {
  EXPECT_EQ(FloatToF16Bits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16Bits(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(FloatToF16Bits(65520.0f), 0x7c00);  // tie above max -> Inf
  EXPECT_EQ(FloatToF16Bits(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToF16Bits(INFINITY), 0x7c00);
  EXPECT_EQ(FloatToF16Bits(-INFINITY), 0xfc00);
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -25)), 0x0000);         // tie to even 0
  EXPECT_EQ(FloatToF16Bits(std::ldexp(3.0f, -25)), 0x0002);         // tie to even 2
  EXPECT_EQ(FloatToF16Bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, even
  EXPECT_EQ(FloatToF16Bits(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, odd -> up
  EXPECT_TRUE(std::isnan(F16BitsToFloat(FloatToF16Bits(NAN))));
  EXPECT_EQ(F16BitsToFloat(0x0001), std::ldexp(1.0f, -24));
  // Tensor path (vector + tail) agrees with the scalar one.
  const int64_t n = 1037;
  Tensor src = Random({n}, 3, -70000.0f, 70000.0f), dst = Make({n}, DType::kF16);
  Tensor back = Make({n});
  LOOM_ASSERT_OK(Convert(src, &dst));
  LOOM_ASSERT_OK(Convert(dst, &back));
  const uint16_t* h = reinterpret_cast<const uint16_t*>(dst.data<Float16>());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i], FloatToF16Bits(src.data<float>()[i]));
    ASSERT_EQ(Bits(back.data<float>()[i]), Bits(F16BitsToFloat(h[i])));
  }
}

TEST(ConvertTest, ErrorsNameOp) {
  Tensor dst = Make({4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(Convert(Make({5}), &dst), {"Convert", "f32[5]", "bf16[4]"}));
  Tensor di = Make({4}, DType::kI32);
  EXPECT_TRUE(IsInvalidArgument(Convert(Make({4}), &di), {"Convert", "no conversion", "i32"}));
  EXPECT_TRUE(IsInvalidArgument(Convert(Make({4}), nullptr), {"Convert", "dst"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
