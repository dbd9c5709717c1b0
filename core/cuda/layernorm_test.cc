#include "core/cuda/layernorm.h"

#include "core/cpu/layernorm.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaLayerNormTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  const Shape shapes[] = {Shape{1, 1}, Shape{1, 7}, Shape{5, 1024}, Shape{2, 3, 771},
                          Shape{300, 64}, Shape{3, 5000}};
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Shape& s : shapes) {
      const int64_t c = s.dim(s.rank() - 1), rows = s.numel() / c;
      const Tensor x = RoundedTo(Random(s, ++seed, -2.0f, 3.0f), dt);
      const Tensor gamma = RoundedTo(Random(Shape{c}, ++seed, 0.5f, 1.5f), dt);
      const Tensor beta = RoundedTo(Random(Shape{c}, ++seed), dt);
      const Tensor dout = RoundedTo(Random(s, ++seed), dt);
      Tensor want = CpuEmpty(s, DType::kF32), wm = CpuEmpty(Shape{rows}, DType::kF32),
             wr = CpuEmpty(Shape{rows}, DType::kF32);
      LOOM_ASSERT_OK(cpu::LayerNormForward(x, gamma, beta, 1e-5f, &want, &wm, &wr));
      const Tensor gx = ToGpu(x, dt), gg = ToGpu(gamma, dt), gb = ToGpu(beta, dt);
      Tensor out = Poisoned(s, dt), mean = Poisoned(Shape{rows}, DType::kF32),
             rstd = Poisoned(Shape{rows}, DType::kF32);
      LOOM_ASSERT_OK(LayerNormForward(gx, gg, gb, 1e-5f, &out, &mean, &rstd));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << s.ToString();
      // Statistics are f32 from the same (rounded) inputs in both dtypes.
      EXPECT_LE(RelError(ToCpuF32(mean), wm), 1e-5) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(rstd), wr), 1e-5) << s.ToString();

      // Backward from the CPU's statistics; dgamma/dbeta accumulate into f32.
      const Tensor dg0 = Random(Shape{c}, ++seed), db0 = Random(Shape{c}, ++seed);
      Tensor wdx = CpuEmpty(s, DType::kF32), wdg = RoundedTo(dg0, DType::kF32),
             wdb = RoundedTo(db0, DType::kF32);
      LOOM_ASSERT_OK(cpu::LayerNormBackward(dout, x, gamma, wm, wr, &wdx, &wdg, &wdb));
      Tensor dx = Poisoned(s, dt), dg = ToGpu(dg0, DType::kF32), db = ToGpu(db0, DType::kF32);
      LOOM_ASSERT_OK(LayerNormBackward(ToGpu(dout, dt), gx, gg, Upload(wm), Upload(wr), &dx, &dg,
                                       &db));
      // dx: sums over C in another order (5e-5 relative to max |dx| in f32).
      EXPECT_LE(RelError(ToCpuF32(dx), wdx), Tol(dt, 5e-5)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(dg), wdg), Tol(dt, 2e-5)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(db), wdb), Tol(dt, 2e-5)) << s.ToString();
      // dx aliasing dout.
      Tensor inplace = ToGpu(dout, dt), dg2 = ToGpu(dg0, DType::kF32), db2 = ToGpu(db0, DType::kF32);
      LOOM_ASSERT_OK(LayerNormBackward(inplace, gx, gg, Upload(wm), Upload(wr), &inplace, &dg2,
                                       &db2));
      EXPECT_LE(RelError(ToCpuF32(inplace), wdx), Tol(dt, 5e-5)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(dg2), wdg), Tol(dt, 2e-5)) << s.ToString();
    }
  }
}

TEST(CudaLayerNormTest, RejectsBadArguments) {
  Tensor x = Random(Shape{4, 3}, 1), g = Random(Shape{3}, 2), b = Random(Shape{3}, 3);
  Tensor out = CpuEmpty(Shape{4, 3}, DType::kF32), m = CpuEmpty(Shape{4}, DType::kF32);
  Tensor r = CpuEmpty(Shape{4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(LayerNormForward(x, g, b, 1e-5f, &out, &m, &r),
                                {"LayerNormForward", "cpu", "CUDA"}));
  Tensor m16 = CpuEmpty(Shape{4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(LayerNormForward(x, g, b, 1e-5f, &out, &m16, &r),
                                {"mean", "bf16", "f32"}));
  Tensor m5 = CpuEmpty(Shape{5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(LayerNormForward(x, g, b, 1e-5f, &out, &m5, &r),
                                {"mean", "4 elements"}));
  Tensor g4 = Random(Shape{4}, 2);
  EXPECT_TRUE(IsInvalidArgument(LayerNormForward(x, g4, b, 1e-5f, &out, &m, &r), {"gamma"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
