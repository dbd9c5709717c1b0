#include "core/cuda/elementwise.h"

#include "core/cpu/elementwise.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

// Odd shapes: one row, fewer elements than a block, non-multiples of 256/32.
const Shape kShapes[] = {Shape{1, 1}, Shape{1, 1000}, Shape{37, 3}, Shape{3, 5, 129},
                         Shape{300, 257}};

TEST(CudaElementwiseTest, BiasAddForwardAndBackward) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Shape& s : kShapes) {
      const int64_t c = s.dim(s.rank() - 1);
      const Tensor x = RoundedTo(Random(s, ++seed), dt);
      const Tensor bias = RoundedTo(Random(Shape{c}, ++seed), dt);
      Tensor want = CpuEmpty(s, DType::kF32);
      LOOM_ASSERT_OK(cpu::BiasAddForward(x, bias, &want));
      Tensor out = Poisoned(s, dt);
      LOOM_ASSERT_OK(BiasAddForward(ToGpu(x, dt), ToGpu(bias, dt), &out));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << s.ToString();

      // dbias accumulates: start from a non-zero value; f32 and the activation dtype.
      for (DType gdt : {DType::kF32, dt}) {
        const Tensor db0 = RoundedTo(Random(Shape{c}, ++seed), gdt);
        Tensor want_db = RoundedTo(db0, DType::kF32);
        LOOM_ASSERT_OK(cpu::BiasAddBackward(x, &want_db));
        Tensor db = ToGpu(db0, gdt);
        LOOM_ASSERT_OK(BiasAddBackward(ToGpu(x, dt), &db));
        // Column sums of up to 300 rows: f32 sums in another order, 2e-5.
        EXPECT_LE(RelError(ToCpuF32(db), want_db), Tol(gdt, 2e-5)) << s.ToString();
      }
    }
  }
}

TEST(CudaElementwiseTest, GeluForwardAndBackward) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType dt : FloatTypes()) {
    for (const Shape& s : kShapes) {
      const Tensor x = RoundedTo(Random(s, ++seed, -6.0f, 6.0f), dt);
      const Tensor dout = RoundedTo(Random(s, ++seed), dt);
      Tensor want = CpuEmpty(s, DType::kF32), want_dx = CpuEmpty(s, DType::kF32);
      LOOM_ASSERT_OK(cpu::GeluForward(x, &want));
      LOOM_ASSERT_OK(cpu::GeluBackward(x, dout, &want_dx));
      Tensor out = Poisoned(s, dt), dx = Poisoned(s, dt);
      const Tensor gx = ToGpu(x, dt);
      LOOM_ASSERT_OK(GeluForward(gx, &out));
      LOOM_ASSERT_OK(GeluBackward(gx, ToGpu(dout, dt), &dx));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << s.ToString();
      EXPECT_LE(RelError(ToCpuF32(dx), want_dx), Tol(dt)) << s.ToString();
      // In place: out == x.
      Tensor inplace = ToGpu(x, dt);
      LOOM_ASSERT_OK(GeluForward(inplace, &inplace));
      EXPECT_LE(RelError(ToCpuF32(inplace), want), Tol(dt));
    }
  }
}

TEST(CudaElementwiseTest, AddAndScale) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 200;
  for (DType dt : FloatTypes()) {
    for (const Shape& s : kShapes) {
      const Tensor a = RoundedTo(Random(s, ++seed), dt), b = RoundedTo(Random(s, ++seed), dt);
      Tensor want = CpuEmpty(s, DType::kF32);
      LOOM_ASSERT_OK(cpu::Add(a, b, &want));
      Tensor out = Poisoned(s, dt);
      LOOM_ASSERT_OK(Add(ToGpu(a, dt), ToGpu(b, dt), &out));
      EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt, 0.0, 1e-2));  // f32: exact
      Tensor x = ToGpu(a, dt);
      LOOM_ASSERT_OK(Scale(-0.375f, &x));
      Tensor want_s = RoundedTo(a, DType::kF32);
      LOOM_ASSERT_OK(cpu::Scale(-0.375f, &want_s));
      EXPECT_LE(RelError(ToCpuF32(x), want_s), Tol(dt, 0.0, 1e-2));
    }
  }
}

TEST(CudaElementwiseTest, RejectsBadArguments) {
  Tensor x = Random(Shape{4, 3}, 1), bias = Random(Shape{3}, 2);
  Tensor out = CpuEmpty(Shape{4, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(BiasAddForward(x, bias, &out), {"BiasAddForward", "cpu", "CUDA"}));
  Tensor bias4 = Random(Shape{4}, 2);
  EXPECT_TRUE(IsInvalidArgument(BiasAddForward(x, bias4, &out), {"last dim", "bias"}));
  Tensor out16 = CpuEmpty(Shape{4, 3}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(GeluForward(x, &out16), {"GeluForward", "out", "bf16"}));
  Tensor y = Random(Shape{3, 4}, 3);
  EXPECT_TRUE(IsInvalidArgument(Add(x, y, &out), {"Add", "[4, 3]", "[3, 4]"}));
  Tensor ids = CpuEmpty(Shape{3}, DType::kI64);
  EXPECT_TRUE(IsInvalidArgument(Scale(2.0f, &ids), {"Scale", "i64"}));
  EXPECT_TRUE(IsInvalidArgument(Scale(2.0f, nullptr), {"null"}));
}

TEST(CudaElementwiseTest, RejectsMixedDevices) {
  LOOM_REQUIRE_GPU();
  Tensor a = ToGpu(Random(Shape{4}, 1), DType::kF32), b = Random(Shape{4}, 2);
  Tensor out = Poisoned(Shape{4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(Add(a, b, &out), {"Add", "b", "cpu"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
