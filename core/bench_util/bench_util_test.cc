#include "core/bench_util/bench_util.h"

#include <cmath>

#include "gtest/gtest.h"

namespace loom::core::bench {
namespace {

// BENCHMARKS.md's medians were taken as sorted[n / 2]: the helper must agree.
TEST(BenchUtilTest, MedianIsTheUpperMiddleSample) {
  EXPECT_EQ(Median({3.0}), 3.0);
  EXPECT_EQ(Median({5.0, 1.0, 4.0}), 4.0);
  EXPECT_EQ(Median({4.0, 1.0, 3.0, 2.0}), 3.0);
  EXPECT_TRUE(std::isnan(Median({})));
}

}  // namespace
}  // namespace loom::core::bench
