#include "core/cuda/rmsnorm.h"

#include "core/cpu/rmsnorm.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaRmsNormTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  const Shape shapes[] = {Shape{1, 1},      Shape{1, 7},    Shape{5, 4096},
                          Shape{2, 3, 771}, Shape{300, 64}, Shape{3, 5000}};
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Shape& s : shapes) {
      const int64_t c = s.dim(s.rank() - 1), rows = s.numel() / c;
      const Tensor x = RoundedTo(Random(s, ++seed, -2.0f, 3.0f), dt);
      const Tensor gamma = RoundedTo(Random(Shape{c}, ++seed, 0.5f, 1.5f), dt);
      const Tensor dout = RoundedTo(Random(s, ++seed), dt);
      Tensor want = CpuEmpty(s, DType::kF32), wr = CpuEmpty(Shape{rows}, DType::kF32);
      LOOM_ASSERT_OK(cpu::RmsNormForward(x, gamma, 1e-6f, &want, &wr));
      const Tensor gx = ToGpu(x, dt), gg = ToGpu(gamma, dt);
      Tensor out = Poisoned(s, dt), rstd = Poisoned(Shape{rows}, DType::kF32);
      LOOM_ASSERT_OK(RmsNormForward(gx, gg, 1e-6f, &out, &rstd));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(rstd), wr), 1e-5) << s.ToString();

      // Backward from the CPU's rstd; dgamma accumulates into f32 and into the dtype.
      for (DType gdt : {DType::kF32, dt}) {
        const Tensor dg0 = RoundedTo(Random(Shape{c}, ++seed), gdt);
        Tensor wdx = CpuEmpty(s, DType::kF32), wdg = RoundedTo(dg0, DType::kF32);
        LOOM_ASSERT_OK(cpu::RmsNormBackward(dout, x, gamma, wr, &wdx, &wdg));
        Tensor dx = Poisoned(s, dt), dg = ToGpu(dg0, gdt);
        LOOM_ASSERT_OK(RmsNormBackward(ToGpu(dout, dt), gx, gg, Upload(wr), &dx, &dg));
        // dx: sums over C in another order (5e-5 relative to max |dx| in f32).
        EXPECT_LE(RelError(ToCpuF32(dx), wdx), Tol(dt, 5e-5)) << s.ToString();
        EXPECT_LE(RelError(ToCpuF32(dg), wdg), Tol(gdt, 2e-5)) << s.ToString();
      }
      // dx aliasing dout.
      const Tensor dg0 = Random(Shape{c}, ++seed);
      Tensor wdx = CpuEmpty(s, DType::kF32), wdg = RoundedTo(dg0, DType::kF32);
      LOOM_ASSERT_OK(cpu::RmsNormBackward(dout, x, gamma, wr, &wdx, &wdg));
      Tensor inplace = ToGpu(dout, dt), dg = ToGpu(dg0, DType::kF32);
      LOOM_ASSERT_OK(RmsNormBackward(inplace, gx, gg, Upload(wr), &inplace, &dg));
      EXPECT_LE(RelError(ToCpuF32(inplace), wdx), Tol(dt, 5e-5)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(dg), wdg), Tol(dt, 2e-5)) << s.ToString();
    }
  }
}

TEST(CudaRmsNormTest, RejectsBadArguments) {
  Tensor x = Random(Shape{4, 3}, 1), g = Random(Shape{3}, 2);
  Tensor out = CpuEmpty(Shape{4, 3}, DType::kF32), r = CpuEmpty(Shape{4}, DType::kF32);
  EXPECT_TRUE(
      IsInvalidArgument(RmsNormForward(x, g, 1e-6f, &out, &r), {"RmsNormForward", "cpu", "CUDA"}));
  Tensor r16 = CpuEmpty(Shape{4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(x, g, 1e-6f, &out, &r16), {"rstd", "bf16", "f32"}));
  Tensor r5 = CpuEmpty(Shape{5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(x, g, 1e-6f, &out, &r5), {"rstd", "4 elements"}));
  Tensor g4 = Random(Shape{4}, 2);
  EXPECT_TRUE(IsInvalidArgument(RmsNormForward(x, g4, 1e-6f, &out, &r), {"gamma"}));
  Tensor dx = CpuEmpty(Shape{4, 3}, DType::kF32), dg = CpuEmpty(Shape{5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(RmsNormBackward(x, x, g, r, &dx, &dg),
                                {"RmsNormBackward", "dgamma", "[5]"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
