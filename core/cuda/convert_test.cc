#include "core/cuda/convert.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/cpu/convert.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

// Values that exercise rounding: ties, subnormals, overflow to Inf, NaN.
Tensor Tricky(int64_t n) {
  Tensor t = Random(Shape{n}, 3, -70000.0f, 70000.0f);
  float* p = t.data<float>();
  const float special[] = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, 65504.0f, 65520.0f,
                           3.4e38f, -3.4e38f, 1e-40f, -1e-45f, 6e-8f, 3e-8f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < sizeof(special) / sizeof(float) && i < static_cast<size_t>(n); ++i) {
    p[i] = special[i];
  }
  for (int64_t i = 20; i < n; i += 97) p[i] *= 1e-6f;
  return t;
}

TEST(CudaConvertTest, BitIdenticalToCpu) {
  LOOM_REQUIRE_GPU();
  const Tensor src = Tricky(10007);
  for (DType to : {DType::kBF16, DType::kF16}) {
    Tensor want = CpuEmpty(src.shape(), to);
    LOOM_ASSERT_OK(cpu::Convert(src, &want));
    Tensor got = Poisoned(src.shape(), to);
    LOOM_ASSERT_OK(Convert(Upload(src), &got));
    Tensor h = Download(got);
    ASSERT_EQ(0, std::memcmp(h.raw_data(), want.raw_data(), want.nbytes())) << DTypeName(to);
    // And back to f32 (exact widening).
    Tensor wback = CpuEmpty(src.shape(), DType::kF32);
    LOOM_ASSERT_OK(cpu::Convert(want, &wback));
    Tensor back = Poisoned(src.shape(), DType::kF32);
    LOOM_ASSERT_OK(Convert(got, &back));
    Tensor hb = Download(back);
    ASSERT_EQ(0, std::memcmp(hb.raw_data(), wback.raw_data(), wback.nbytes())) << DTypeName(to);
  }
}

TEST(CudaConvertTest, Bf16NanKeepsSignAndPayloadAsCpu) {
  LOOM_REQUIRE_GPU();
  const uint32_t nans[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff812345u};
  Tensor src = CpuEmpty(Shape{4}, DType::kF32);
  std::memcpy(src.raw_data(), nans, sizeof(nans));
  Tensor want = CpuEmpty(Shape{4}, DType::kBF16);
  LOOM_ASSERT_OK(cpu::Convert(src, &want));
  Tensor got = Poisoned(Shape{4}, DType::kBF16);
  LOOM_ASSERT_OK(Convert(Upload(src), &got));
  Tensor h = Download(got);
  EXPECT_EQ(0, std::memcmp(h.raw_data(), want.raw_data(), want.nbytes()));
}

TEST(CudaConvertTest, RejectsBadArguments) {
  Tensor a = Random(Shape{4}, 1), b = CpuEmpty(Shape{4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(Convert(a, &b), {"Convert", "cpu", "CUDA"}));
  Tensor c = CpuEmpty(Shape{5}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(Convert(a, &c), {"different element counts"}));
  Tensor i = CpuEmpty(Shape{4}, DType::kI32);
  EXPECT_TRUE(IsInvalidArgument(Convert(a, &i), {"no conversion", "i32"}));
  EXPECT_TRUE(IsInvalidArgument(Convert(b, &i), {"no conversion"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
