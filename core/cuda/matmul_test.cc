#include "core/cuda/matmul.h"

#include "core/cpu/matmul.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

// f32: cuBLAS sums K products in another order than oneDNN (and may split K),
// so results differ by a few ulps of the partial sums: 2e-5 relative to the
// largest output for K up to ~1000 with inputs in [-1, 1].
constexpr double kF32Tol = 2e-5;

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

void RunMatmul(const Case& c, DType dt, bool f32_out, uint64_t seed) {
  const Shape sa = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
  const Shape sb = c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
  const Tensor a = RoundedTo(Random(sa, seed), dt);
  const Tensor b = RoundedTo(Random(sb, seed + 1), dt);
  const DType out_dt = f32_out ? DType::kF32 : dt;
  const Tensor c0 = RoundedTo(Random(Shape{c.m, c.n}, seed + 2), out_dt);
  Tensor want = RoundedTo(c0, DType::kF32);
  const cpu::MatmulOptions o{c.ta, c.tb, c.alpha, c.beta};
  LOOM_ASSERT_OK(cpu::Matmul(a, b, &want, o));
  Tensor ga = ToGpu(a, dt), gb = ToGpu(b, dt);
  Tensor gc = c.beta == 0.0f ? Poisoned(Shape{c.m, c.n}, out_dt) : ToGpu(c0, out_dt);
  LOOM_ASSERT_OK(cuda::Matmul(ga, gb, &gc, o));
  EXPECT_LE(RelError(ToCpuF32(gc), want), Tol(out_dt, kF32Tol))
      << DTypeName(dt) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.ta
      << " tb=" << c.tb << " beta=" << c.beta;
}

TEST(CudaMatmulTest, MatchesCpuAllTransposesAndOddShapes) {
  LOOM_REQUIRE_GPU();
  const Case cases[] = {{1, 1, 1, false, false, 1, 0},     {17, 33, 65, false, false, 1, 0},
                        {17, 33, 65, true, false, 0.5f, 0}, {17, 33, 65, false, true, 1, 1},
                        {17, 33, 65, true, true, 2, 0.5f}, {128, 96, 1000, false, true, 1, 0},
                        {1, 513, 7, false, false, 1, 1},   {300, 1, 129, true, false, 1, 0}};
  uint64_t seed = 10;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) RunMatmul(c, dt, false, seed += 3);
  }
  // bf16 inputs accumulated into an f32 output (weight gradients).
  RunMatmul({64, 48, 200, true, false, 1, 1}, DType::kBF16, true, 99);
}

TEST(CudaMatmulTest, EmptyInnerDimScalesC) {
  LOOM_REQUIRE_GPU();
  Tensor a = ToGpu(Random(Shape{3, 0}, 1), DType::kF32);
  Tensor b = ToGpu(Random(Shape{0, 4}, 2), DType::kF32);
  Tensor c = Poisoned(Shape{3, 4}, DType::kF32);
  LOOM_ASSERT_OK(cuda::Matmul(a, b, &c));
  Tensor got = ToCpuF32(c);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got.data<float>()[i], 0.0f);
}

TEST(CudaBatchedMatmulTest, MatchesCpuRank3AndRank4) {
  LOOM_REQUIRE_GPU();
  for (DType dt : FloatTypes()) {
    for (int rank : {3, 4}) {
      const Shape sa = rank == 3 ? Shape{5, 19, 37} : Shape{2, 3, 37, 19};  // rank 4: trans_a
      const Shape sb = rank == 3 ? Shape{5, 23, 37} : Shape{2, 3, 37, 23};
      const Shape sc = rank == 3 ? Shape{5, 19, 23} : Shape{2, 3, 19, 23};
      const cpu::MatmulOptions o = rank == 3 ? cpu::MatmulOptions{false, true, 1, 0}
                                             : cpu::MatmulOptions{true, false, 1, 0};
      const Tensor a = RoundedTo(Random(sa, 5), dt), b = RoundedTo(Random(sb, 6), dt);
      Tensor want = CpuEmpty(sc, DType::kF32);
      LOOM_ASSERT_OK(cpu::BatchedMatmul(a, b, &want, o));
      Tensor gc = Poisoned(sc, dt);
      LOOM_ASSERT_OK(cuda::BatchedMatmul(ToGpu(a, dt), ToGpu(b, dt), &gc, o));
      EXPECT_LE(RelError(ToCpuF32(gc), want), Tol(dt, kF32Tol)) << DTypeName(dt) << " " << rank;
    }
  }
}

// Argument errors are found before any CUDA call: these run without a GPU.
TEST(CudaMatmulTest, RejectsBadArguments) {
  Tensor a = Random(Shape{2, 3}, 1), b = Random(Shape{3, 4}, 2);
  Tensor c = CpuEmpty(Shape{2, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::Matmul(a, b, &c), {"Matmul", "a", "cpu", "CUDA"}));
  Tensor bad_c = CpuEmpty(Shape{2, 5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::Matmul(a, b, &bad_c), {"Matmul", "c", "[2, 4]"}));
  Tensor b_inner = Random(Shape{4, 4}, 3);
  EXPECT_TRUE(IsInvalidArgument(cuda::Matmul(a, b_inner, &c), {"inner dims", "3 vs 4"}));
  Tensor ids = CpuEmpty(Shape{2, 3}, DType::kI32);
  EXPECT_TRUE(IsInvalidArgument(cuda::Matmul(ids, b, &c), {"Matmul", "a", "i32", "f32 or bf16"}));
  Tensor b16 = CpuEmpty(Shape{3, 4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::Matmul(a, b16, &c), {"b", "bf16", "same dtype"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::Matmul(a, b, nullptr), {"c", "null"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::BatchedMatmul(a, b, &c), {"BatchedMatmul", "rank 3"}));
}

TEST(CudaMatmulTest, RejectsMixedDevices) {
  LOOM_REQUIRE_GPU();
  Tensor a = ToGpu(Random(Shape{2, 3}, 1), DType::kF32);
  Tensor b = Random(Shape{3, 4}, 2);
  Tensor c = Poisoned(Shape{2, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::Matmul(a, b, &c), {"Matmul", "b", "cpu"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
