// The CUDA MoE kernels against the CPU ones (core/cpu/moe.h) on random data:
// ragged shapes, ties, a capacity (padded or not), experts without tokens,
// no tokens; activations f32 and bf16; outputs poisoned first. Indices and
// layouts exactly, f32 values within rounding (the GPU sums in another
// order). Skips without a GPU; the argument checks run everywhere.

#include "core/cuda/moe.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/moe.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

struct Case {
  int64_t T, E, K, capacity;
  bool pad, ties;
  int64_t h;
};

const Case kCases[] = {
    {37, 8, 2, 0, false, false, 13},  {50, 6, 3, 0, false, true, 33},
    {21, 5, 1, 0, false, false, 7},   {40, 4, 2, 10, true, false, 64},
    {40, 4, 2, 7, false, true, 5},    {1, 3, 3, 0, false, false, 1},
    {0, 4, 2, 0, false, false, 8},    {1000, 16, 2, 0, false, false, 257},
    {777, 64, 6, 100, true, false, 96}, {300, 8, 2, 0, false, true, 1024},
};

Tensor Logits(const Case& c, uint64_t seed) {
  Tensor t = Random(Shape{c.T, c.E}, seed, -3.0f, 3.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (c.ties) p[i] = std::round(p[i]);
    if (i % c.E >= c.E - 2 && c.E > 3) p[i] -= 50.0f;  // the last two experts get no token
  }
  return t;
}

template <typename T>
std::vector<T> Vec(const Tensor& cpu) {
  return std::vector<T>(cpu.data<T>(), cpu.data<T>() + cpu.numel());
}

int64_t Rows(const std::vector<double>& stats, const Case& c) {
  int64_t n = 0;
  for (int64_t e = 0; e < c.E; ++e) {
    const int64_t count = static_cast<int64_t>(stats[e]);
    n += c.capacity > 0 ? (c.pad ? c.capacity : std::min(count, c.capacity)) : count;
  }
  return n;
}

TEST(CudaMoeTest, RoutingMatchesCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " E " << c.E << " K " << c.K);
    const ops::MoeRouteOptions o{c.E, c.K, c.capacity, c.pad};
    const Tensor logits = Logits(c, ++seed);
    Tensor ex = CpuEmpty(Shape{c.T, c.K}, DType::kI32), pr = CpuEmpty(Shape{c.T, c.K}, DType::kF32);
    Tensor st = CpuEmpty(Shape{2 * c.E + 1}, DType::kF64);
    LOOM_ASSERT_OK(cpu::MoeRouteTopK(logits, o, &ex, &pr, &st));
    const int64_t n = Rows(Vec<double>(st), c);
    Tensor row = CpuEmpty(Shape{c.T, c.K}, DType::kI32), rt = CpuEmpty(Shape{n}, DType::kI32);
    LOOM_ASSERT_OK(cpu::MoeRouteLayout(ex, pr, o, &row, &rt));

    Tensor gex = Poisoned(ex.shape(), DType::kI32), gpr = Poisoned(pr.shape(), DType::kF32);
    Tensor gst = Poisoned(st.shape(), DType::kF64);
    LOOM_ASSERT_OK(MoeRouteTopK(Upload(logits), o, &gex, &gpr, &gst));
    EXPECT_EQ(Vec<int32_t>(Download(gex)), Vec<int32_t>(ex));
    EXPECT_LT(RelError(ToCpuF32(gpr), pr), 1e-6);
    const std::vector<double> got = Vec<double>(Download(gst)), want = Vec<double>(st);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-9 * (1 + std::fabs(want[i]))) << "stats " << i;
    }
    // The layout from the CPU's choices (the GPU's probabilities may differ
    // in the last bit, which could move a capacity cut).
    Tensor grow = Poisoned(row.shape(), DType::kI32), grt = Poisoned(rt.shape(), DType::kI32);
    LOOM_ASSERT_OK(MoeRouteLayout(Upload(ex), Upload(pr), o, &grow, &grt));
    EXPECT_EQ(Vec<int32_t>(Download(grow)), Vec<int32_t>(row));
    EXPECT_EQ(Vec<int32_t>(Download(grt)), Vec<int32_t>(rt));
  }
}

TEST(CudaMoeTest, PermuteCombineAndBackwardsMatchCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType dt : FloatTypes()) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " T " << c.T << " K " << c.K << " h "
                                        << c.h);
      const ops::MoeRouteOptions o{c.E, c.K, c.capacity, c.pad};
      const int64_t T = c.T, K = c.K, h = c.h;
      Tensor ex = CpuEmpty(Shape{T, K}, DType::kI32), pr = CpuEmpty(Shape{T, K}, DType::kF32);
      Tensor st = CpuEmpty(Shape{2 * c.E + 1}, DType::kF64);
      LOOM_ASSERT_OK(cpu::MoeRouteTopK(Logits(c, ++seed), o, &ex, &pr, &st));
      const int64_t N = Rows(Vec<double>(st), c);
      Tensor row = CpuEmpty(Shape{T, K}, DType::kI32), rt = CpuEmpty(Shape{N}, DType::kI32);
      LOOM_ASSERT_OK(cpu::MoeRouteLayout(ex, pr, o, &row, &rt));
      const Tensor x = RoundedTo(Random(Shape{T, h}, ++seed), dt);
      const Tensor rows = RoundedTo(Random(Shape{N, h}, ++seed), dt);
      const Tensor dy = RoundedTo(Random(Shape{T, h}, ++seed), dt);
      const Tensor grow = Upload(row), gpr = Upload(pr);

      Tensor want = CpuEmpty(Shape{N, h}, DType::kF32);
      LOOM_ASSERT_OK(cpu::MoePermute(x, rt, &want));
      Tensor got = Poisoned(Shape{N, h}, dt);
      LOOM_ASSERT_OK(MoePermute(ToGpu(x, dt), Upload(rt), &got));
      EXPECT_EQ(Vec<float>(ToCpuF32(got)), Vec<float>(want)) << "permute";

      Tensor dx_want = CpuEmpty(Shape{T, h}, DType::kF32);
      LOOM_ASSERT_OK(cpu::MoePermuteBackward(rows, row, &dx_want));
      Tensor dx = Poisoned(Shape{T, h}, dt);
      LOOM_ASSERT_OK(MoePermuteBackward(ToGpu(rows, dt), grow, &dx));
      if (dt == DType::kF32) {  // the same additions in the same order
        EXPECT_EQ(Vec<float>(ToCpuF32(dx)), Vec<float>(dx_want)) << "permute backward";
      } else {
        EXPECT_LT(RelError(ToCpuF32(dx), RoundedTo(dx_want, dt)), Tol(dt)) << "permute backward";
      }

      Tensor y_want = CpuEmpty(Shape{T, h}, DType::kF32);
      LOOM_ASSERT_OK(cpu::MoeCombineForward(rows, pr, row, &y_want));
      Tensor y = Poisoned(Shape{T, h}, dt);
      LOOM_ASSERT_OK(MoeCombineForward(ToGpu(rows, dt), gpr, grow, &y));
      EXPECT_LT(RelError(ToCpuF32(y), y_want), Tol(dt)) << "combine";

      Tensor dr_want = CpuEmpty(Shape{N, h}, DType::kF32), dp_want = CpuEmpty(Shape{T, K}, DType::kF32);
      LOOM_ASSERT_OK(cpu::MoeCombineBackward(dy, rows, pr, row, &dr_want, &dp_want));
      Tensor dr = Poisoned(Shape{N, h}, dt), dp = Poisoned(Shape{T, K}, DType::kF32);
      LOOM_ASSERT_OK(MoeCombineBackward(ToGpu(dy, dt), ToGpu(rows, dt), gpr, grow, &dr, &dp));
      EXPECT_LT(RelError(ToCpuF32(dr), dr_want), Tol(dt)) << "combine backward rows";
      EXPECT_LT(RelError(ToCpuF32(dp), dp_want), 1e-6) << "combine backward probabilities";
    }
  }
}

TEST(CudaMoeTest, RouterBackwardMatchesCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 300;
  for (const Case& c : kCases) {
    for (int losses = 0; losses < 4; ++losses) {
      SCOPED_TRACE(::testing::Message() << "T " << c.T << " E " << c.E << " losses " << losses);
      const ops::MoeRouteOptions o{c.E, c.K, 0, false};
      const Tensor logits = Logits(c, ++seed);
      Tensor ex = CpuEmpty(Shape{c.T, c.K}, DType::kI32), pr = CpuEmpty(Shape{c.T, c.K}, DType::kF32);
      Tensor st = CpuEmpty(Shape{2 * c.E + 1}, DType::kF64);
      LOOM_ASSERT_OK(cpu::MoeRouteTopK(logits, o, &ex, &pr, &st));
      const Tensor dprob = Random(Shape{c.T, c.K}, ++seed);
      Tensor aux = CpuEmpty(Shape{c.E}, DType::kF64);
      for (int64_t e = 0; e < c.E; ++e) aux.data<double>()[e] = 1e-3 * double(e + 1);
      ops::MoeRouterBackwardOptions b;
      b.aux_loss = losses & 1;
      b.z_loss = losses & 2;
      b.z_scale = 0.75 * 0.001 * 2.0;
      Tensor want = CpuEmpty(Shape{c.T, c.E}, DType::kF32);
      LOOM_ASSERT_OK(cpu::MoeRouterBackward(logits, ex, pr, dprob, aux, b, &want));
      Tensor got = Poisoned(Shape{c.T, c.E}, DType::kF32);
      LOOM_ASSERT_OK(MoeRouterBackward(Upload(logits), Upload(ex), Upload(pr), Upload(dprob),
                                       Upload(aux), b, &got));
      EXPECT_LT(RelError(ToCpuF32(got), want), 1e-5);
    }
  }
}

// The shared contract's errors, before any CUDA call (no GPU needed).
TEST(CudaMoeTest, BadShapesAreRefusedAsOnTheCpu) {
  const Tensor logits = Random(Shape{5, 4}, 1);
  Tensor ex = CpuEmpty(Shape{5, 2}, DType::kI32), pr = CpuEmpty(Shape{5, 2}, DType::kF32);
  Tensor st = CpuEmpty(Shape{9}, DType::kF64);
  EXPECT_TRUE(IsInvalidArgument(MoeRouteTopK(logits, {4, 5}, &ex, &pr, &st),
                                {"MoeRouteTopK", "top-5 of 4"}));
  Tensor short_stats = CpuEmpty(Shape{8}, DType::kF64);
  EXPECT_TRUE(IsInvalidArgument(MoeRouteTopK(logits, {4, 2}, &ex, &pr, &short_stats),
                                {"stats", "9 elements"}));
  Tensor out = CpuEmpty(Shape{2, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(MoePermute(Random(Shape{5, 3}, 2), Ids(Shape{2}, DType::kI32, {0, 1}), &out),
                                {"MoePermute", "out", "[2, 3]"}));
  Tensor dl = CpuEmpty(Shape{5, 4}, DType::kF32);
  ops::MoeRouterBackwardOptions b;
  b.aux_loss = true;
  EXPECT_TRUE(IsInvalidArgument(MoeRouterBackward(logits, ex, pr, pr, Tensor(), b, &dl),
                                {"MoeRouterBackward", "aux_grad"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
