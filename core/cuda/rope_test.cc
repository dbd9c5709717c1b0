#include "core/cuda/rope.h"

#include "core/cpu/rope.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaRopeTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  struct Case {
    Shape shape;
    cpu::RopeOptions o;
  };
  // Whole and partial rotary dims, Llama 3's base, a long-context offset.
  const Case cases[] = {{Shape{1, 1, 1, 2}, {}},
                        {Shape{7, 2, 3, 128}, {}},
                        {Shape{5, 1, 4, 64}, {500000.0f, 0, 37}},
                        {Shape{9, 2, 2, 40}, {10000.0f, 16, 3}},
                        {Shape{3, 1, 2, 128}, {10000.0f, 0, 1000000}},
                        {Shape{300, 1, 2, 6}, {}}};
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) {
      const Shape& s = c.shape;
      const Tensor x = RoundedTo(Random(s, ++seed, -2.0f, 2.0f), dt);
      Tensor want = CpuEmpty(s, DType::kF32), want_dx = CpuEmpty(s, DType::kF32);
      LOOM_ASSERT_OK(cpu::RopeForward(x, c.o, &want));
      LOOM_ASSERT_OK(cpu::RopeBackward(x, c.o, &want_dx));
      Tensor out = Poisoned(s, dt), dx = Poisoned(s, dt);
      const Tensor gx = ToGpu(x, dt);
      LOOM_ASSERT_OK(cuda::RopeForward(gx, c.o, &out));
      LOOM_ASSERT_OK(cuda::RopeBackward(gx, c.o, &dx));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(dx), want_dx), Tol(dt)) << s.ToString();
      // In place (the passed-through dims are left alone).
      Tensor inplace = ToGpu(x, dt);
      LOOM_ASSERT_OK(cuda::RopeForward(inplace, c.o, &inplace));
      EXPECT_LE(RelError(ToCpuF32(inplace), want), Tol(dt)) << s.ToString();
      LOOM_ASSERT_OK(cuda::RopeBackward(inplace, c.o, &inplace));
      EXPECT_LE(RelError(ToCpuF32(inplace), RoundedTo(x, DType::kF32)), Tol(dt, 1e-5, 2e-2));
    }
  }
}

TEST(CudaRopeTest, RejectsBadArguments) {
  const Tensor x = Random(Shape{2, 1, 2, 6}, 1);
  Tensor out = CpuEmpty(Shape{2, 1, 2, 6}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::RopeForward(x, {}, &out), {"RopeForward", "cpu", "CUDA"}));
  cpu::RopeOptions o;
  o.rotary_dim = 8;
  EXPECT_TRUE(IsInvalidArgument(cuda::RopeForward(x, o, &out), {"rotary_dim is 8", "head dim 6"}));
  const Tensor x3 = Random(Shape{2, 2, 6}, 1);
  Tensor out3 = CpuEmpty(Shape{2, 2, 6}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::RopeBackward(x3, {}, &out3), {"RopeBackward", "dout"}));
  Tensor out16 = CpuEmpty(Shape{2, 1, 2, 6}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::RopeForward(x, {}, &out16), {"out", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
