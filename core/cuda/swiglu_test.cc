#include "core/cuda/swiglu.h"

#include "core/cpu/swiglu.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaSwigluTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  // [rows, 2F] and the output [rows, F]: one element, odd F, Llama-7B's F.
  const Shape shapes[][2] = {{Shape{1, 2}, Shape{1, 1}},
                             {Shape{37, 6}, Shape{37, 3}},
                             {Shape{3, 5, 258}, Shape{3, 5, 129}},
                             {Shape{4, 22016}, Shape{4, 11008}}};
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const auto& [s, half] : shapes) {
      const Tensor x = RoundedTo(Random(s, ++seed, -8.0f, 8.0f), dt);
      const Tensor dout = RoundedTo(Random(half, ++seed), dt);
      Tensor want = CpuEmpty(half, DType::kF32), want_dx = CpuEmpty(s, DType::kF32);
      LOOM_ASSERT_OK(cpu::SwigluForward(x, &want));
      LOOM_ASSERT_OK(cpu::SwigluBackward(dout, x, &want_dx));
      Tensor out = Poisoned(half, dt), dx = Poisoned(s, dt);
      const Tensor gx = ToGpu(x, dt), gd = ToGpu(dout, dt);
      LOOM_ASSERT_OK(SwigluForward(gx, &out));
      LOOM_ASSERT_OK(SwigluBackward(gd, gx, &dx));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(dx), want_dx), Tol(dt)) << s.ToString();
      // dx over x.
      Tensor inplace = ToGpu(x, dt);
      LOOM_ASSERT_OK(SwigluBackward(gd, inplace, &inplace));
      EXPECT_LE(RelError(ToCpuF32(inplace), want_dx), Tol(dt)) << s.ToString();
    }
  }
}

TEST(CudaSwigluTest, RejectsBadArguments) {
  const Tensor x = Random(Shape{3, 8}, 1);
  Tensor out = CpuEmpty(Shape{3, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(x, &out), {"SwigluForward", "cpu", "CUDA"}));
  Tensor odd = CpuEmpty(Shape{3, 7}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(odd, &out), {"SwigluForward", "x", "2F > 0"}));
  Tensor out5 = CpuEmpty(Shape{3, 5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(x, &out5), {"out", "[3, 5]"}));
  Tensor dx = CpuEmpty(Shape{3, 8}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SwigluBackward(x, x, &dx), {"SwigluBackward", "dout", "[3, 8]"}));
  Tensor dx16 = CpuEmpty(Shape{3, 8}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(SwigluBackward(out, x, &dx16), {"dx", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
