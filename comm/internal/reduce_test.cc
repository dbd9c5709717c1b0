#include "comm/internal/reduce.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu/convert.h"
#include "gtest/gtest.h"

namespace loom::comm::internal {
namespace {

using core::cpu::Bf16BitsToFloat;
using core::cpu::FloatToBf16Bits;

TEST(Half, RoundTripsExactValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 3.0f, 1000.0f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(v)), v) << v;
    EXPECT_NEAR(Bf16BitsToFloat(FloatToBf16Bits(v)), v, std::fabs(v) / 128) << v;
  }
  EXPECT_EQ(F16ToF32(F32ToF16(1e6f)), INFINITY);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(NAN))));
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(NAN))));
  // Round to nearest even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(F16ToF32(F32ToF16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(F16ToF32(F32ToF16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  // Subnormal f16.
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
}

TEST(ReduceInto, EveryOpAndDType) {
  float a[3] = {1, 5, -2}, b[3] = {4, 2, -3};
  ReduceInto(a, b, 3, core::DType::kF32, ReduceOp::kMax);
  EXPECT_EQ(a[0], 4);
  EXPECT_EQ(a[1], 5);
  EXPECT_EQ(a[2], -2);
  int64_t x[2] = {3, -4}, y[2] = {5, 6};
  ReduceInto(x, y, 2, core::DType::kI64, ReduceOp::kProd);
  EXPECT_EQ(x[0], 15);
  EXPECT_EQ(x[1], -24);
  uint8_t u[2] = {200, 3}, v[2] = {10, 9};
  ReduceInto(u, v, 2, core::DType::kU8, ReduceOp::kMin);
  EXPECT_EQ(u[0], 10);
  EXPECT_EQ(u[1], 3);
  uint16_t h[2] = {FloatToBf16Bits(1.5f), FloatToBf16Bits(-3)};
  uint16_t k[2] = {FloatToBf16Bits(2.25f), FloatToBf16Bits(1)};
  ReduceInto(h, k, 2, core::DType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(Bf16BitsToFloat(h[0]), 3.75f);
  EXPECT_EQ(Bf16BitsToFloat(h[1]), -2.0f);
  int32_t s[2] = {7, -7};
  FinishAvg(s, 2, core::DType::kI32, 2);
  EXPECT_EQ(s[0], 3);
  EXPECT_EQ(s[1], -3);
  uint16_t f[1] = {F32ToF16(3)};
  FinishAvg(f, 1, core::DType::kF16, 2);
  EXPECT_EQ(F16ToF32(f[0]), 1.5f);
}

TEST(ReduceTo, WritesTheThirdBufferAndLeavesBothInputs) {
  const float a[3] = {1, 5, -2}, b[3] = {4, 2, -3};
  float out[3] = {NAN, NAN, NAN};
  ReduceTo(out, a, b, 3, core::DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[1], 7);
  EXPECT_EQ(out[2], -5);
  EXPECT_EQ(a[0], 1);
  EXPECT_EQ(b[0], 4);
  // 16-bit types go through f32 in blocks; 300 elements cross a block edge.
  std::vector<uint16_t> x(300), y(300), z(300, 0xffff);
  for (int i = 0; i < 300; ++i) {
    x[i] = F32ToF16(static_cast<float>(i));
    y[i] = F32ToF16(static_cast<float>(2 * i));
  }
  ReduceTo(z.data(), x.data(), y.data(), 300, core::DType::kF16, ReduceOp::kMax);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(F16ToF32(z[i]), 2.0f * i) << i;
  EXPECT_EQ(F16ToF32(x[299]), 299.0f);
}

// bf16 goes through core/cpu/convert.h's rounding: the exact bits of a
// rounded sum, and a NaN operand gives a quiet NaN that keeps sign and payload.
TEST(ReduceInto, Bf16BitsAreCoresRounding) {
  // 1 + 2^-8 is halfway between 1 and the next bf16 (1 + 2^-7): rounds to
  // even (1.0, 0x3f80); 1 + 3 * 2^-8 rounds up to 1 + 2^-6 (0x3f82).
  uint16_t acc[4] = {0x3f80, 0x3f80, 0x7f81 /* signalling NaN */, 0xffc3 /* -NaN */};
  const uint16_t add[4] = {0x3b80 /* 2^-8 */, 0x3c40 /* 3 * 2^-8 */, 0x3f80, 0x3f80};
  ReduceInto(acc, add, 4, core::DType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(acc[0], 0x3f80);
  EXPECT_EQ(acc[1], 0x3f82);
  EXPECT_EQ(acc[2], 0x7fc1);  // quietened, payload kept
  EXPECT_EQ(acc[3], 0xffc3);
  for (uint16_t bits : {uint16_t{0x3f80}, uint16_t{0x3f82}, uint16_t{0x7fc1}, uint16_t{0xffc3}}) {
    EXPECT_EQ(FloatToBf16Bits(Bf16BitsToFloat(bits)), bits);
  }
}

}  // namespace
}  // namespace loom::comm::internal
