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

// Accumulated on the device across calls, read once: the CPU's running sum
// up to the order inside each call.
TEST(CudaReduceTest, SumSquaresIntoAccumulatesOnTheDevice) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 40;
  for (DType dt : FloatTypes()) {
    Tensor acc = *Tensor::Zeros(Shape{1}, DType::kF64)->To(Device::CUDA(0));
    double host = 0.0;
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      const Tensor x = RoundedTo(Random(Shape{n}, ++seed, -1.0f, 2.0f), dt);
      ASSERT_TRUE(SumSquaresInto(ToGpu(x, dt), &acc).ok());
      host += *cpu::SumSquares(x);
    }
    const double got = acc.To(Device::CPU())->data<double>()[0];
    EXPECT_NEAR(got, host, 1e-12 * (1.0 + host));
  }
}

TEST(CudaReduceTest, RejectsBadArguments) {
  Tensor x = Random(Shape{4}, 1);
  EXPECT_TRUE(IsInvalidArgument(Sum(x).status(), {"Sum", "cpu", "CUDA"}));
  Tensor i = CpuEmpty(Shape{4}, DType::kI32);
  EXPECT_TRUE(IsInvalidArgument(L2Norm(i).status(), {"L2Norm", "i32"}));
  Tensor acc = CpuEmpty(Shape{1}, DType::kF64);
  EXPECT_TRUE(IsInvalidArgument(SumSquaresInto(x, nullptr), {"SumSquaresInto", "acc"}));
  EXPECT_TRUE(IsInvalidArgument(SumSquaresInto(x, &acc), {"SumSquaresInto", "cpu", "CUDA"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
