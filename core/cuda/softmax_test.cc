#include "core/cuda/softmax.h"

#include "core/cpu/softmax.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaSoftmaxTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  const Shape shapes[] = {Shape{1, 1}, Shape{1, 33}, Shape{64, 5}, Shape{3, 2, 1000},
                          Shape{2, 50257}};
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Shape& s : shapes) {
      const Tensor x = RoundedTo(Random(s, ++seed, -8.0f, 8.0f), dt);
      const Tensor dout = RoundedTo(Random(s, ++seed), dt);
      Tensor want = CpuEmpty(s, DType::kF32), wdx = CpuEmpty(s, DType::kF32);
      LOOM_ASSERT_OK(cpu::SoftmaxForward(x, &want));
      Tensor out = Poisoned(s, dt);
      LOOM_ASSERT_OK(SoftmaxForward(ToGpu(x, dt), &out));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << s.ToString();
      // Backward from the same (dtype-rounded) probabilities on both sides.
      const Tensor y = ToCpuF32(out);
      LOOM_ASSERT_OK(cpu::SoftmaxBackward(y, dout, &wdx));
      Tensor dx = Poisoned(s, dt);
      LOOM_ASSERT_OK(SoftmaxBackward(ToGpu(y, dt), ToGpu(dout, dt), &dx));
      EXPECT_LE(RelError(ToCpuF32(dx), wdx), Tol(dt)) << s.ToString();
      // In place.
      Tensor inplace = ToGpu(x, dt);
      LOOM_ASSERT_OK(SoftmaxForward(inplace, &inplace));
      EXPECT_LE(RelError(ToCpuF32(inplace), want), Tol(dt));
    }
  }
}

TEST(CudaSoftmaxTest, RejectsBadArguments) {
  Tensor x = Random(Shape{2, 3}, 1), out = CpuEmpty(Shape{2, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SoftmaxForward(x, &out), {"SoftmaxForward", "cpu"}));
  Tensor empty = CpuEmpty(Shape{2, 0}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SoftmaxForward(empty, &empty), {"non-empty last dim"}));
  Tensor bad = CpuEmpty(Shape{3, 2}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SoftmaxBackward(x, bad, &out), {"SoftmaxBackward", "[3, 2]"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
