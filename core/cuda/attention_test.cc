#include "core/cuda/attention.h"

#include "absl/strings/str_cat.h"
#include "core/cpu/attention.h"
#include "core/cpu/flash_attention.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

// f32: the GEMMs sum in another order than oneDNN and the softmax uses expf
// instead of the CPU's polynomial exp: 3e-5 relative to the largest value.
// bf16: scores, probabilities and dS are stored in bf16 between the GEMMs
// (as Megatron's unfused path does), so errors compound over the chain of
// GEMMs: 2e-2 for probs/out, 3e-2 for dqkv, against the CPU on the same
// bf16-rounded inputs.
constexpr double kF32Tol = 3e-5;

struct Case {
  int64_t s, b, heads, d;
  cpu::AttentionDropout dropout;
};

void Check(const Case& c, DType dt, uint64_t seed) {
  const Shape sq{c.s, c.b, c.heads * 3 * c.d}, so{c.s, c.b, c.heads * c.d};
  const Shape sp{c.b, c.heads, c.s, c.s};
  // bf16 scores are rounded to 8 bits before the softmax: keep them O(1)
  // (|score| <~ 3) so that rounding stays well inside the tolerance.
  const float r = dt == DType::kF32 ? 2.0f : 1.0f;
  const Tensor qkv = RoundedTo(Random(sq, seed, -r, r), dt);
  const Tensor dout = RoundedTo(Random(so, seed + 1), dt);
  Tensor want = CpuEmpty(so, DType::kF32), wprobs = CpuEmpty(sp, DType::kF32);
  LOOM_ASSERT_OK(cpu::AttentionForward(qkv, c.heads, &want, &wprobs, c.dropout));
  const Tensor gqkv = ToGpu(qkv, dt);
  Tensor out = Poisoned(so, dt), probs = Poisoned(sp, dt);
  LOOM_ASSERT_OK(cuda::AttentionForward(gqkv, c.heads, &out, &probs, c.dropout));
  const std::string what = absl::StrCat(DTypeName(dt), " s=", c.s, " b=", c.b, " heads=", c.heads,
                                        " d=", c.d, " p=", c.dropout.p);
  EXPECT_LE(RelError(ToCpuF32(probs), wprobs), Tol(dt, kF32Tol, 2e-2)) << what;
  EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt, kF32Tol, 2e-2)) << what;
  // Backward from the CPU's probabilities (rounded to dt) on both sides.
  const Tensor p_in = RoundedTo(wprobs, dt);
  Tensor wdqkv = CpuEmpty(sq, DType::kF32);
  LOOM_ASSERT_OK(cpu::AttentionBackward(dout, qkv, p_in, c.heads, &wdqkv, c.dropout));
  Tensor dqkv = Poisoned(sq, dt);
  LOOM_ASSERT_OK(
      cuda::AttentionBackward(ToGpu(dout, dt), gqkv, ToGpu(p_in, dt), c.heads, &dqkv, c.dropout));
  EXPECT_LE(RelError(ToCpuF32(dqkv), wdqkv), Tol(dt, kF32Tol, 3e-2)) << what;
}

TEST(CudaAttentionTest, MatchesCpuWithoutDropout) {
  LOOM_REQUIRE_GPU();
  const Case cases[] = {{1, 1, 1, 1, {}}, {5, 2, 3, 8, {}}, {130, 2, 2, 16, {}},
                        {257, 1, 4, 64, {}}};
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) Check(c, dt, seed += 2);
  }
}

TEST(CudaAttentionTest, MatchesCpuWithDropoutAtGlobalIndices) {
  LOOM_REQUIRE_GPU();
  cpu::AttentionDropout d;
  d.p = 0.2f;
  d.seed = 77;
  d.offset = 5;
  cpu::AttentionDropout tp = d;  // a tensor-parallel rank owning heads [2, 4) of 6
  tp.head_offset = 2;
  tp.total_heads = 6;
  // 600: three causal GEMM blocks of 256 rows, the last one partial.
  const Case cases[] = {{33, 2, 3, 8, d}, {129, 2, 2, 16, tp}, {600, 1, 2, 16, d}};
  uint64_t seed = 50;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) Check(c, dt, seed += 2);
  }
}

TEST(CudaAttentionTest, RejectsBadArguments) {
  Tensor qkv = Random(Shape{4, 2, 2 * 3 * 8}, 1);
  Tensor out = CpuEmpty(Shape{4, 2, 16}, DType::kF32);
  Tensor probs = CpuEmpty(Shape{2, 2, 4, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::AttentionForward(qkv, 2, &out, &probs),
                                {"AttentionForward", "qkv", "cpu"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::AttentionForward(qkv, 5, &out, &probs), {"heads=5"}));
  Tensor bad_probs = CpuEmpty(Shape{2, 2, 4, 5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::AttentionForward(qkv, 2, &out, &bad_probs), {"probs", "[2, 2, 4, 4]"}));
  cpu::AttentionDropout d;
  d.p = 0.1f;
  d.head_offset = 1;
  d.total_heads = 2;
  EXPECT_TRUE(IsInvalidArgument(cuda::AttentionForward(qkv, 2, &out, &probs, d), {"head_offset"}));
  Tensor dqkv16 = CpuEmpty(Shape{4, 2, 48}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::AttentionBackward(out, qkv, probs, 2, &dqkv16), {"dqkv", "bf16"}));
}

// ---------------------------------------------------------------- flash ----

// The flash kernels against the CPU flash kernels (the oracle). f32: expf and
// another summation order, as above. bf16: only the inputs and outputs are
// bf16 (every product, the softmax and the accumulators are f32), so the
// error is the rounding of the stored out / dqkv: 1e-2.
void CheckFlash(const Case& c, DType dt, uint64_t seed) {
  const Shape sq{c.s, c.b, c.heads * 3 * c.d}, so{c.s, c.b, c.heads * c.d};
  const Shape sl{c.b, c.heads, c.s};
  const Tensor qkv = RoundedTo(Random(sq, seed, -2.0f, 2.0f), dt);
  const Tensor dout = RoundedTo(Random(so, seed + 1), dt);
  Tensor want = CpuEmpty(so, DType::kF32), wlse = CpuEmpty(sl, DType::kF32);
  LOOM_ASSERT_OK(cpu::FlashAttentionForward(qkv, c.heads, &want, &wlse, c.dropout));
  const Tensor gqkv = ToGpu(qkv, dt);
  Tensor out = Poisoned(so, dt), lse = Poisoned(sl, DType::kF32);
  LOOM_ASSERT_OK(cuda::FlashAttentionForward(gqkv, c.heads, &out, &lse, c.dropout));
  const std::string what = absl::StrCat("flash ", DTypeName(dt), " s=", c.s, " b=", c.b,
                                        " heads=", c.heads, " d=", c.d, " p=", c.dropout.p);
  EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt, kF32Tol, 1e-2)) << what;
  EXPECT_LE(RelError(ToCpuF32(lse), wlse), kF32Tol) << what;
  // Backward from the CPU's out (rounded to dt) and lse on both sides.
  const Tensor o_in = RoundedTo(want, dt);
  Tensor wdqkv = CpuEmpty(sq, DType::kF32);
  LOOM_ASSERT_OK(cpu::FlashAttentionBackward(dout, qkv, o_in, wlse, c.heads, &wdqkv, c.dropout));
  Tensor dqkv = Poisoned(sq, dt);
  LOOM_ASSERT_OK(cuda::FlashAttentionBackward(ToGpu(dout, dt), gqkv, ToGpu(o_in, dt),
                                              ToGpu(wlse, DType::kF32), c.heads, &dqkv,
                                              c.dropout));
  EXPECT_LE(RelError(ToCpuF32(dqkv), wdqkv), Tol(dt, 2 * kF32Tol, 1e-2)) << what;
}

TEST(CudaFlashAttentionTest, MatchesCpuFlashKernel) {
  LOOM_REQUIRE_GPU();
  cpu::AttentionDropout d;
  d.p = 0.2f;
  d.seed = 77;
  d.offset = 5;
  cpu::AttentionDropout tp = d;  // a tensor-parallel rank owning heads [2, 4) of 6
  tp.head_offset = 2;
  tp.total_heads = 6;
  // Tiles of 64 rows (d <= 64) or 32 (d <= 256): ragged ends, one token, d = 128 and 256.
  const Case cases[] = {{1, 1, 1, 4, {}},    {5, 2, 3, 8, d},     {130, 2, 2, 16, {}},
                        {129, 2, 2, 16, tp}, {257, 1, 4, 64, d},  {100, 1, 2, 128, d},
                        {70, 1, 1, 256, {}}, {600, 1, 2, 64, d}};
  uint64_t seed = 90;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) CheckFlash(c, dt, seed += 2);
  }
}

TEST(CudaFlashAttentionTest, RejectsBadArguments) {
  Tensor qkv = Random(Shape{4, 2, 2 * 3 * 8}, 1);
  Tensor out = CpuEmpty(Shape{4, 2, 16}, DType::kF32);
  Tensor lse = CpuEmpty(Shape{2, 2, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionForward(qkv, 2, &out, &lse),
                                {"FlashAttentionForward", "cpu"}));
  Tensor bad_lse = CpuEmpty(Shape{2, 2, 5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionForward(qkv, 2, &out, &bad_lse),
                                {"lse", "[2, 2, 4]"}));
  Tensor lse16 = CpuEmpty(Shape{2, 2, 4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionForward(qkv, 2, &out, &lse16), {"lse", "bf16"}));
  Tensor big = Random(Shape{4, 1, 3 * 512}, 2);
  Tensor big_out = CpuEmpty(Shape{4, 1, 512}, DType::kF32);
  Tensor big_lse = CpuEmpty(Shape{1, 1, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionForward(big, 1, &big_out, &big_lse),
                                {"head dim 512"}));
  Tensor dqkv16 = CpuEmpty(Shape{4, 2, 48}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionBackward(out, qkv, out, lse, 2, &dqkv16),
                                {"dqkv", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
