#include "core/cuda/reduce.h"

#include <cmath>

#include "core/cpu/reduce.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaReduceTest, MatchesCpuInDouble) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{100003}, int64_t{3000001}}) {
      const Tensor x = RoundedTo(Random(Shape{n}, ++seed, -1.0f, 2.0f), dt);
      const Tensor g = ToGpu(x, dt);
      // Both sum the same (rounded) values in double: only the order differs.
      absl::StatusOr<double> s = Sum(g), ss = SumSquares(g), l2 = L2Norm(g);
      ASSERT_TRUE(s.ok() && ss.ok() && l2.ok()) << s.status();
      const double ws = *cpu::Sum(x), wss = *cpu::SumSquares(x), wl2 = *cpu::L2Norm(x);
      EXPECT_NEAR(*s, ws, 1e-12 * (1.0 + n)) << n;
      EXPECT_NEAR(*ss, wss, 1e-12 * (1.0 + wss)) << n;
      EXPECT_NEAR(*l2, wl2, 1e-12 * (1.0 + wl2)) << n;
      // Deterministic: the same bits twice.
      EXPECT_EQ(*Sum(g), *s);
    }
  }
}

TEST(CudaReduceTest, RejectsBadArguments) {
  Tensor x = Random(Shape{4}, 1);
  EXPECT_TRUE(IsInvalidArgument(Sum(x).status(), {"Sum", "cpu", "CUDA"}));
  Tensor i = CpuEmpty(Shape{4}, DType::kI32);
  EXPECT_TRUE(IsInvalidArgument(L2Norm(i).status(), {"L2Norm", "i32"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
