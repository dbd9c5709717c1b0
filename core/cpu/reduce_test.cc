#include "core/cpu/reduce.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// Accumulated in double: agrees with a sequential double sum to ~1e-12.
constexpr double kTol = 1e-12;

TEST(ReduceTest, SumAndSquaresMatchDoubleReference) {
  const Tensor x = Random({3, 100003}, 1, -2.0f, 3.0f);
  double s = 0, ss = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<float>()[i];
    s += v;
    ss += v * v;
  }
  EXPECT_NEAR(*Sum(x), s, kTol * std::fabs(s) + 1e-9);
  EXPECT_NEAR(*SumSquares(x), ss, kTol * ss);
  EXPECT_NEAR(*L2Norm(x), std::sqrt(ss), kTol * std::sqrt(ss));
  EXPECT_EQ(*Sum(Make({0})), 0.0);
}

TEST(ReduceTest, SameBitsForAnyThreadCount) {
  const Tensor x = Random({5, 70001}, 2, -1.0f, 1.0f);  // 6 blocks of 64K, ragged end
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one_sum = *Sum(x), one_squares = *SumSquares(x);
  omp_set_num_threads(threads > 1 ? threads : 2);
  EXPECT_EQ(*Sum(x), one_sum);
  EXPECT_EQ(*SumSquares(x), one_squares);
  omp_set_num_threads(threads);
}

// Blocks are read several at a time in lockstep (reduce.cc); each block's sum
// must have the bits it has alone, or the norm would depend on where a
// tensor's blocks fall in the groups.
TEST(ReduceTest, BlocksReadTogetherSumAsTheyDoAlone) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  const Tensor x = Random({9 * kBlock + 777}, 3, -1.5f, 1.5f);
  double sum = 0, squares = 0;
  for (int64_t b = 0; b * kBlock < x.numel(); ++b) {
    const int64_t len = std::min(kBlock, x.numel() - b * kBlock);
    const Tensor block = *x.View(b * kBlock, Shape{len});
    sum += *Sum(block);
    squares += *SumSquares(block);
  }
  EXPECT_EQ(*Sum(x), sum);
  EXPECT_EQ(*SumSquares(x), squares);
}

TEST(ReduceTest, ErrorsNameOp) {
  EXPECT_TRUE(IsInvalidArgument(Sum(Make({3}, DType::kI32)).status(), {"Sum", "i32"}));
  EXPECT_TRUE(IsInvalidArgument(SumSquares(Tensor()).status(), {"SumSquares", "undefined"}));
  EXPECT_TRUE(IsInvalidArgument(L2Norm(Make({3}, DType::kF64)).status(), {"L2Norm", "f64"}));
}

// SumSquaresInto adds each call's sum to the accumulator: the same double
// additions, in the same order, as summing SumSquares on the host.
TEST(ReduceTest, SumSquaresIntoAccumulatesLikeHostSums) {
  Tensor acc = Make({1}, DType::kF64);
  acc.data<double>()[0] = 0.0;
  double host = 0.0;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{70001}, int64_t{300007}}) {
    const Tensor x = Random({n}, 10 + n, -2.0f, 2.0f);
    ASSERT_TRUE(SumSquaresInto(x, &acc).ok());
    host += *SumSquares(x);
    EXPECT_EQ(acc.data<double>()[0], host) << n;
  }
  const Tensor x = Random({4}, 1);
  EXPECT_TRUE(IsInvalidArgument(SumSquaresInto(x, nullptr), {"SumSquaresInto", "acc"}));
  Tensor f32 = Make({1}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(SumSquaresInto(x, &f32), {"SumSquaresInto", "f64"}));
  Tensor two = Make({2}, DType::kF64);
  EXPECT_TRUE(IsInvalidArgument(SumSquaresInto(x, &two), {"SumSquaresInto", "one element"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
