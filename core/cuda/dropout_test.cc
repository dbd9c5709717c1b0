#include "core/cuda/dropout.h"

#include <cstring>

#include "core/cpu/dropout.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

// The GPU mask must equal the CPU's exactly (same Philox bits), so kept
// values match to the output dtype's rounding and the masks bit for bit.
TEST(CudaDropoutTest, MasksAreBitIdenticalToCpu) {
  LOOM_REQUIRE_GPU();
  struct Case {
    Shape shape;
    cpu::GlobalIndex where;
    float p;
  };
  const Case cases[] = {
      {Shape{1, 1}, {0, 0}, 0.5f},          {Shape{7, 333}, {0, 0}, 0.1f},
      {Shape{5, 129}, {1000003, 0}, 0.3f},  // a sequence-parallel slice
      {Shape{6, 64}, {17, 1024}, 0.9f},     // a tensor-parallel column slice
      {Shape{3, 2, 77}, {0, 0}, 0.0f},      {Shape{4, 50}, {0, 0}, 1.0f},
  };
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) {
      const cpu::DropoutOptions o{c.p, 0x1234567890abcdefull + seed, 42 + seed};
      const Tensor x = RoundedTo(Random(c.shape, ++seed), dt);
      Tensor want = CpuEmpty(c.shape, DType::kF32), wmask = CpuEmpty(c.shape, DType::kU8);
      LOOM_ASSERT_OK(cpu::DropoutForward(x, &want, o, c.where, &wmask));
      Tensor out = Poisoned(c.shape, dt), mask = Poisoned(c.shape, DType::kU8);
      LOOM_ASSERT_OK(cuda::DropoutForward(ToGpu(x, dt), &out, o, c.where, &mask));
      Tensor gmask = Download(mask);
      ASSERT_EQ(0, std::memcmp(gmask.raw_data(), wmask.raw_data(), wmask.nbytes()))
          << c.shape.ToString() << " p=" << c.p;
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt, 1e-6)) << c.shape.ToString();
      // Backward regenerates the same mask (in place here).
      const Tensor dout = RoundedTo(Random(c.shape, ++seed), dt);
      Tensor wdx = CpuEmpty(c.shape, DType::kF32);
      LOOM_ASSERT_OK(cpu::DropoutBackward(dout, &wdx, o, c.where));
      Tensor dx = ToGpu(dout, dt);
      LOOM_ASSERT_OK(cuda::DropoutBackward(dx, &dx, o, c.where));
      EXPECT_LE(RelError(ToCpuF32(dx), wdx), Tol(dt, 1e-6)) << c.shape.ToString();
    }
  }
}

TEST(CudaDropoutTest, RejectsBadArguments) {
  Tensor x = Random(Shape{2, 3}, 1), out = CpuEmpty(Shape{2, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::DropoutForward(x, &out, {1.5f, 0, 0}), {"p = 1.5"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::DropoutForward(x, &out, {0.5f, 0, 0}, {0, 2}),
                                {"row_stride", ">= 3"}));
  Tensor mask = CpuEmpty(Shape{2, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::DropoutForward(x, &out, {0.5f, 0, 0}, {}, &mask), {"mask", "u8"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::DropoutForward(x, &out, {0.5f, 0, 0}), {"DropoutForward", "cpu"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
