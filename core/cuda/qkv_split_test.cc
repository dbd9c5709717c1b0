#include "core/cuda/qkv_split.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/qkv_split.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

struct Case {
  int64_t s, b, heads, groups, d;
  bool rope;
  int64_t rotary_dim, offset;
};

ops::QkvSplitOptions OptionsOf(const Case& c) {
  ops::QkvSplitOptions o;
  o.heads = c.heads;
  o.groups = c.groups;
  o.rope = c.rope;
  o.rope_options.base = 10000.0f;
  o.rope_options.rotary_dim = c.rotary_dim;
  o.rope_options.position_offset = c.offset;
  return o;
}

// Ragged shapes (d and r / 2 not multiples of the 16-byte chunk: the scalar
// path), GQA and not, partial rotary dims, a CP-like offset, and model shapes
// (GPT-2's d 64 without rope, Llama's d 128 with 32 heads in 8 groups).
const Case kCases[] = {
    {1, 1, 1, 1, 2, true, 0, 0},          {7, 3, 6, 2, 4, true, 0, 0},
    {5, 2, 4, 4, 6, true, 0, 0},          {9, 2, 6, 3, 40, true, 16, 5},
    {3, 2, 4, 2, 12, false, 0, 0},        {4, 3, 8, 1, 16, true, 8, 1000},
    {13, 1, 3, 3, 10, true, 6, 0},        {33, 2, 12, 12, 64, true, 32, 0},
    {17, 2, 12, 4, 64, false, 0, 0},      {64, 2, 32, 8, 128, true, 0, 0},
    {40, 1, 16, 2, 128, true, 64, 4096},
};

Shape ProjShape(const Case& c) {
  const int64_t g = c.groups == 0 ? c.heads : c.groups;
  return Shape{c.s, c.b, g * (c.heads / g + 2) * c.d};
}
Shape QkvShape(const Case& c) { return Shape{c.s, c.b, c.heads * 3 * c.d}; }

TEST(CudaQkvSplitTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Case& c : kCases) {
      const ops::QkvSplitOptions o = OptionsOf(c);
      const std::string name = ProjShape(c).ToString() + (c.rope ? " rope" : "");
      const Tensor proj = RoundedTo(Random(ProjShape(c), ++seed, -2.0f, 2.0f), dt);
      const Tensor dqkv = RoundedTo(Random(QkvShape(c), ++seed, -2.0f, 2.0f), dt);
      Tensor want = CpuEmpty(QkvShape(c), DType::kF32), want_d = CpuEmpty(ProjShape(c), DType::kF32);
      LOOM_ASSERT_OK(cpu::QkvSplitRopeForward(proj, o, &want));
      LOOM_ASSERT_OK(cpu::QkvSplitRopeBackward(dqkv, o, &want_d));
      Tensor qkv = Poisoned(QkvShape(c), dt), dproj = Poisoned(ProjShape(c), dt);
      LOOM_ASSERT_OK(cuda::QkvSplitRopeForward(ToGpu(proj, dt), o, &qkv));
      const Tensor gdqkv = ToGpu(dqkv, dt);
      LOOM_ASSERT_OK(cuda::QkvSplitRopeBackward(gdqkv, o, &dproj));
      // Without rope the forward copies: exact in every dtype.
      EXPECT_LE(RelError(ToCpuF32(qkv), want), c.rope ? Tol(dt) : 0.0) << name;
      EXPECT_LE(RelError(ToCpuF32(dproj), want_d), Tol(dt)) << name;
      // Deterministic: the same bits again (no atomics).
      Tensor again = Poisoned(ProjShape(c), dt);
      LOOM_ASSERT_OK(cuda::QkvSplitRopeBackward(gdqkv, o, &again));
      const Tensor a = Download(dproj), b = Download(again);
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << name;
    }
  }
}

// Tensors at an offset that is not 16-byte aligned take the scalar path.
TEST(CudaQkvSplitTest, UnalignedViewsMatchCpu) {
  LOOM_REQUIRE_GPU();
  const Case c{6, 2, 4, 2, 16, true, 0, 3};
  const ops::QkvSplitOptions o = OptionsOf(c);
  for (DType dt : FloatTypes()) {
    const Shape ps = ProjShape(c), qs = QkvShape(c);
    // One element into a larger buffer, on both devices.
    const Tensor big = RoundedTo(Random(Shape{ps.numel() + 1}, 3, -2.0f, 2.0f), dt);
    const Tensor proj = *big.View(1, ps);
    Tensor want = CpuEmpty(qs, DType::kF32);
    LOOM_ASSERT_OK(cpu::QkvSplitRopeForward(proj, o, &want));
    const Tensor view = *ToGpu(big, dt).View(1, ps);
    Tensor out_big = Poisoned(Shape{qs.numel() + 1}, dt);
    Tensor out = *out_big.View(1, qs);
    LOOM_ASSERT_OK(cuda::QkvSplitRopeForward(view, o, &out));
    EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt)) << DTypeName(dt);
  }
}

TEST(CudaQkvSplitTest, RejectsBadArgumentsAsTheCpuDoes) {
  ops::QkvSplitOptions o;
  o.heads = 4;
  o.groups = 2;
  const Tensor proj = Random(Shape{2, 1, 2 * 4 * 6}, 1);  // d = 6
  Tensor qkv = CpuEmpty(Shape{2, 1, 4 * 3 * 6}, DType::kF32);
  // Placement: CUDA wants device tensors.
  EXPECT_TRUE(IsInvalidArgument(cuda::QkvSplitRopeForward(proj, o, &qkv),
                                {"QkvSplitRopeForward", "cpu", "CUDA"}));
  // Shapes and options: the shared contract's message on both devices.
  // (The messages name each tensor's device, so compare what they say.)
  auto same_error = [](const absl::Status& cpu_status, const absl::Status& cuda_status,
                       const std::vector<std::string>& needles) {
    EXPECT_TRUE(IsInvalidArgument(cpu_status, needles)) << cpu_status;
    EXPECT_TRUE(IsInvalidArgument(cuda_status, needles)) << cuda_status;
  };
  ops::QkvSplitOptions bad = o;
  bad.groups = 3;
  if (GpuStatus().ok()) {
    Tensor gqkv = Poisoned(Shape{2, 1, 4 * 3 * 6}, DType::kF32);
    const Tensor gproj = ToGpu(proj, DType::kF32);
    same_error(cpu::QkvSplitRopeForward(proj, bad, &qkv), cuda::QkvSplitRopeForward(gproj, bad, &gqkv),
               {"heads 4, groups 3"});
    bad = o;
    bad.rope = true;
    bad.rope_options.rotary_dim = 8;
    same_error(cpu::QkvSplitRopeForward(proj, bad, &qkv), cuda::QkvSplitRopeForward(gproj, bad, &gqkv),
               {"rotary_dim is 8", "head dim 6"});
    Tensor gshort = Poisoned(Shape{2, 1, 4 * 3 * 5}, DType::kF32);
    Tensor cshort = CpuEmpty(Shape{2, 1, 4 * 3 * 5}, DType::kF32);
    same_error(cpu::QkvSplitRopeBackward(cshort, o, &qkv), cuda::QkvSplitRopeBackward(gshort, o, &gqkv),
               {"QkvSplitRopeBackward", "dproj"});
  }
  Tensor out16 = CpuEmpty(Shape{2, 1, 4 * 3 * 6}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::QkvSplitRopeForward(proj, o, &out16), {"qkv", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
