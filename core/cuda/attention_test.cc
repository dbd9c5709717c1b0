#include "core/cuda/attention.h"

#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cpu/attention.h"
#include "core/cpu/attention_checks.h"
#include "core/cpu/flash_attention.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

using cpu::AttentionSaved;

// f32: the GEMMs sum in another order than oneDNN and the softmax uses expf
// instead of the CPU's polynomial exp: 3e-5 relative to the largest value.
constexpr double kF32Tol = 3e-5;

// A kernel under test (named by what its forward keeps, as in
// cpu/attention_checks.h) and its bf16 tolerances against the CPU kernel on
// the same bf16-rounded inputs.
struct Kernel {
  AttentionSaved saved;
  float bf16_range;  // bf16 qkv in [-r, r) (f32: [-2, 2))
  double bf16_out_tol, f32_dqkv_tol, bf16_dqkv_tol;
};
// The s x s kernel stores scores, probabilities and dS in bf16 between the
// GEMMs (as Megatron's unfused path does), so errors compound over the chain
// of GEMMs: 2e-2 for probs/out, 3e-2 for dqkv. Its bf16 scores are rounded
// to 8 bits before the softmax: keep them O(1) (|score| <~ 3) so that
// rounding stays well inside the tolerance.
constexpr Kernel kProbsKernel{AttentionSaved::kProbs, 1.0f, 2e-2, kF32Tol, 3e-2};
// The flash kernel: only the inputs and outputs are bf16 (every product, the
// softmax and the accumulators are f32; lse is f32), so the error is the
// rounding of the stored out / dqkv: 1e-2.
constexpr Kernel kFlashKernel{AttentionSaved::kLse, 2.0f, 1e-2, 2 * kF32Tol, 1e-2};

// The kernel on the GPU for CUDA tensors, else the CPU one (the oracle).
absl::Status Forward(AttentionSaved k, const Tensor& qkv, int64_t heads, Tensor* out, Tensor* saved,
                     const cpu::AttentionDropout& dr) {
  const bool gpu = qkv.device().type == DeviceType::kCUDA;
  if (k == AttentionSaved::kProbs) {
    return gpu ? cuda::AttentionForward(qkv, heads, out, saved, dr)
               : cpu::AttentionForward(qkv, heads, out, saved, dr);
  }
  return gpu ? cuda::FlashAttentionForward(qkv, heads, out, saved, dr)
             : cpu::FlashAttentionForward(qkv, heads, out, saved, dr);
}
absl::Status Backward(AttentionSaved k, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                      const Tensor& saved, int64_t heads, Tensor* dqkv,
                      const cpu::AttentionDropout& dr) {
  const bool gpu = qkv.device().type == DeviceType::kCUDA;
  if (k == AttentionSaved::kProbs) {
    return gpu ? cuda::AttentionBackward(dout, qkv, saved, heads, dqkv, dr)
               : cpu::AttentionBackward(dout, qkv, saved, heads, dqkv, dr);
  }
  return gpu ? cuda::FlashAttentionBackward(dout, qkv, out, saved, heads, dqkv, dr)
             : cpu::FlashAttentionBackward(dout, qkv, out, saved, heads, dqkv, dr);
}

struct Case {
  int64_t s, b, heads, d;
  cpu::AttentionDropout dropout;
};

// The GPU kernel against the CPU one, forward, then backward from the CPU's
// forward results (rounded to the GPU's dtypes) on both sides.
void Check(const Kernel& k, const Case& c, DType dt, uint64_t seed) {
  const Shape sq{c.s, c.b, c.heads * 3 * c.d}, so{c.s, c.b, c.heads * c.d};
  const Shape ss = ops::SavedShape(k.saved, {c.s, c.b, c.heads, c.d});
  const DType saved_dt = k.saved == AttentionSaved::kProbs ? dt : DType::kF32;
  const float r = dt == DType::kF32 ? 2.0f : k.bf16_range;
  const Tensor qkv = RoundedTo(Random(sq, seed, -r, r), dt);
  const Tensor dout = RoundedTo(Random(so, seed + 1), dt);
  Tensor want = CpuEmpty(so, DType::kF32), wsaved = CpuEmpty(ss, DType::kF32);
  LOOM_ASSERT_OK(Forward(k.saved, qkv, c.heads, &want, &wsaved, c.dropout));
  const Tensor gqkv = ToGpu(qkv, dt);
  Tensor out = Poisoned(so, dt), saved = Poisoned(ss, saved_dt);
  LOOM_ASSERT_OK(Forward(k.saved, gqkv, c.heads, &out, &saved, c.dropout));
  const std::string what = absl::StrCat(k.saved == AttentionSaved::kLse ? "flash " : "",
                                        DTypeName(dt), " s=", c.s, " b=", c.b, " heads=", c.heads,
                                        " d=", c.d, " p=", c.dropout.p);
  EXPECT_LE(RelError(ToCpuF32(out), want), Tol(dt, kF32Tol, k.bf16_out_tol)) << what;
  EXPECT_LE(RelError(ToCpuF32(saved), wsaved), Tol(saved_dt, kF32Tol, k.bf16_out_tol)) << what;
  const Tensor o_in = RoundedTo(want, dt), s_in = RoundedTo(wsaved, saved_dt);
  Tensor wdqkv = CpuEmpty(sq, DType::kF32);
  LOOM_ASSERT_OK(Backward(k.saved, dout, qkv, o_in, s_in, c.heads, &wdqkv, c.dropout));
  Tensor dqkv = Poisoned(sq, dt);
  LOOM_ASSERT_OK(Backward(k.saved, ToGpu(dout, dt), gqkv, ToGpu(o_in, dt), ToGpu(s_in, saved_dt),
                          c.heads, &dqkv, c.dropout));
  EXPECT_LE(RelError(ToCpuF32(dqkv), wdqkv), Tol(dt, k.f32_dqkv_tol, k.bf16_dqkv_tol)) << what;
}

// Every case in every float dtype, the seeds from first_seed + 2 on.
void CheckAll(const Kernel& k, std::initializer_list<Case> cases, uint64_t first_seed) {
  uint64_t seed = first_seed;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) Check(k, c, dt, seed += 2);
  }
}

// Dropout as a whole run, and as a tensor-parallel rank owning heads [2, 4) of 6.
constexpr cpu::AttentionDropout kDropout{0.2f, 77, 5, 0, 0};
constexpr cpu::AttentionDropout kRankDropout{0.2f, 77, 5, 2, 6};

TEST(CudaAttentionTest, MatchesCpuWithoutDropout) {
  LOOM_REQUIRE_GPU();
  CheckAll(kProbsKernel, {{1, 1, 1, 1, {}}, {5, 2, 3, 8, {}}, {130, 2, 2, 16, {}},
                          {257, 1, 4, 64, {}}}, 1);
}

TEST(CudaAttentionTest, MatchesCpuWithDropoutAtGlobalIndices) {
  LOOM_REQUIRE_GPU();
  // 600: three causal GEMM blocks of 256 rows, the last one partial.
  CheckAll(kProbsKernel,
           {{33, 2, 3, 8, kDropout}, {129, 2, 2, 16, kRankDropout}, {600, 1, 2, 16, kDropout}},
           50);
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
  EXPECT_TRUE(IsInvalidArgument(cuda::AttentionForward(qkv, 2, &out, nullptr),
                                {"AttentionForward", "output probs is null"}));
}

// ---------------------------------------------------------------- flash ----

// The flash kernels against the CPU flash kernels (the oracle).
TEST(CudaFlashAttentionTest, MatchesCpuFlashKernel) {
  LOOM_REQUIRE_GPU();
  // Tiles of 64 rows (d <= 64) or 32 (d <= 256): ragged ends, one token, d = 128 and 256.
  CheckAll(kFlashKernel,
           {{1, 1, 1, 4, {}}, {5, 2, 3, 8, kDropout}, {130, 2, 2, 16, {}},
            {129, 2, 2, 16, kRankDropout}, {257, 1, 4, 64, kDropout}, {100, 1, 2, 128, kDropout},
            {70, 1, 1, 256, {}}, {600, 1, 2, 64, kDropout}},
           90);
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
  Tensor dqkv = CpuEmpty(Shape{4, 2, 48}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionBackward(out, qkv, out, lse16, 2, &dqkv),
                                {"FlashAttentionBackward", "lse", "bf16"}));
  Tensor out16 = CpuEmpty(Shape{4, 2, 16}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionBackward(out, qkv, out16, lse, 2, &dqkv),
                                {"FlashAttentionBackward", "out", "bf16"}));
  EXPECT_TRUE(IsInvalidArgument(cuda::FlashAttentionBackward(out, qkv, out, lse, 2, &dqkv),
                                {"FlashAttentionBackward", "dout", "cpu"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
