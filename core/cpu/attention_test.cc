#include "core/cpu/attention.h"

#include <cmath>

#include "core/cpu/attention_test_util.h"
#include "core/cpu/philox.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

using Case = AttentionCase;

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, MatchesDoubleReference) {
  ExpectMatchesDoubleReference(AttentionSaved::kProbs, GetParam());
}

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  ExpectGradientMatchesFiniteDifferences(AttentionSaved::kProbs, GetParam(), {}, 1, 20);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(Case{5, 2, 2, 3},      // pairs >= threads
                                           Case{1, 1, 1, 4},      // one token
                                           Case{7, 1, 1, 8},      // one pair: threaded GEMMs
                                           Case{300, 1, 2, 8},    // several causal blocks
                                           Case{129, 2, 3, 4}));  // block edge

TEST(AttentionTest, HeadSliceOfTensorParallelRankMatchesFullRun) {
  // A TP rank owning heads [1, 3) of 4 sees the contiguous column slice.
  const int64_t s = 9, b = 2, heads = 4, d = 5, local = 2;
  const Tensor qkv = Random({s, b, heads * 3 * d}, 1);
  const Tensor full = RunAttention(AttentionSaved::kProbs, qkv, heads, {}).out;
  const Tensor want = SliceHeads(full, heads, 1, local);
  const Tensor got =
      RunAttention(AttentionSaved::kProbs, SliceHeads(qkv, heads, 1, local), local, {}).out;
  for (int64_t i = 0; i < want.numel(); ++i) {
    EXPECT_FLOAT_EQ(got.data<float>()[i], want.data<float>()[i]) << "element " << i;
  }
}

// ---------------------------------------------------------------- dropout ----

// Backward with dropout on, against central differences: the mask is a fixed
// function of (seed, offset, index), so the loss is a smooth function of qkv.
TEST_P(AttentionTest, DropoutBackwardMatchesFiniteDifferences) {
  ExpectGradientMatchesFiniteDifferences(AttentionSaved::kProbs, GetParam(),
                                         AttentionDropout{0.3f, 11, 22, 0, 0}, 1, 30);
}

// With V = identity (d = s, v_j = e_j), out row i IS the dropped probability
// row: check every element is either 0 or probs / (1 - p), exactly per the
// documented mask (DropoutBitsAt at the global index), and that the empirical
// keep rate is 1 - p.
TEST(AttentionDropoutTest, MaskIsPhiloxAtGlobalIndexAndKeepRateIsOneMinusP) {
  const int64_t s = 64, b = 2, heads = 2, d = 64;
  for (const float p_drop : {0.1f, 0.5f}) {
    const AttentionDropout dr{p_drop, 5, 77, 0, 0};
    Tensor qkv = Random({s, b, heads * 3 * d}, 1, -2.0f, 2.0f);
    SetIdentityV(&qkv, heads);
    Tensor out = Make({s, b, heads * d}), probs = Make({b, heads, s, s});
    LOOM_ASSERT_OK(AttentionForward(qkv, heads, &out, &probs, dr));
    const uint32_t threshold = DropoutThreshold(p_drop);
    int64_t kept = 0, total = 0;
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < s; ++i) {
          for (int64_t j = 0; j < s; ++j) {
            const int64_t index = ((bi * heads + h) * s + i) * s + j;
            const float pij = probs.data<float>()[index];
            const float got = out.data<float>()[((i * b + bi) * heads + h) * d + j];
            if (j > i) {
              EXPECT_EQ(got, 0.0f);
              continue;
            }
            const bool keep = DropoutBitsAt(dr.seed, dr.offset, index) >= threshold;
            EXPECT_NEAR(got, keep ? pij / (1.0f - p_drop) : 0.0f, 1e-6f * (1 + pij))
                << "b " << bi << " h " << h << " i " << i << " j " << j;
            kept += keep;
            ++total;
          }
        }
      }
    }
    EXPECT_NEAR(static_cast<double>(kept) / total, 1.0 - p_drop, 0.02) << "p " << p_drop;
  }
}

// A TP rank owning heads [2, 4) of 4 (head_offset = 2, total_heads = 4) gets
// exactly its part of the full 4-head result, forward and backward.
TEST(AttentionDropoutTest, TensorParallelSliceMatchesFullRun) {
  ExpectTensorParallelSliceIsBitwiseTheFullRun(AttentionSaved::kProbs);
}

// p = 0 (any seed) is bitwise the dropout-free kernel, forward and backward.
TEST(AttentionDropoutTest, ZeroProbabilityIsIdenticalToNoDropout) {
  const int64_t s = 130, b = 2, heads = 3, d = 4;
  const Tensor qkv = Random({s, b, heads * 3 * d}, 1);
  const Tensor dout = Random({s, b, heads * d}, 2);
  Tensor out0 = Make({s, b, heads * d}), probs0 = Make({b, heads, s, s});
  Tensor out1 = Make({s, b, heads * d}), probs1 = Make({b, heads, s, s});
  Tensor dqkv0 = Make(qkv.shape()), dqkv1 = Make(qkv.shape());
  const AttentionDropout zero{0.0f, 123, 456, 0, 0};
  LOOM_ASSERT_OK(AttentionForward(qkv, heads, &out0, &probs0));
  LOOM_ASSERT_OK(AttentionForward(qkv, heads, &out1, &probs1, zero));
  LOOM_ASSERT_OK(AttentionBackward(dout, qkv, probs0, heads, &dqkv0));
  LOOM_ASSERT_OK(AttentionBackward(dout, qkv, probs1, heads, &dqkv1, zero));
  EXPECT_TRUE(SameFloats(out1, out0));
  EXPECT_TRUE(SameFloats(probs1, probs0));
  EXPECT_TRUE(SameFloats(dqkv1, dqkv0));
  // And with p > 0 probs are still the pre-dropout softmax.
  const AttentionDropout on{0.5f, 123, 456, 0, 0};
  LOOM_ASSERT_OK(AttentionForward(qkv, heads, &out1, &probs1, on));
  EXPECT_TRUE(SameFloats(probs1, probs0));
}

TEST(AttentionDropoutTest, BadOptionsAreInvalidArgument) {
  Tensor out = Make({4, 2, 6}), probs = Make({2, 2, 4, 4});
  const Tensor qkv = Make({4, 2, 18});
  EXPECT_TRUE(IsInvalidArgument(AttentionForward(qkv, 2, &out, &probs, {1.5f, 0, 0, 0, 0}),
                                {"AttentionForward", "p = 1.5"}));
  EXPECT_TRUE(IsInvalidArgument(AttentionForward(qkv, 2, &out, &probs, {0.1f, 0, 0, 3, 4}),
                                {"AttentionForward", "head_offset = 3", "heads=2"}));
  Tensor dqkv = Make({4, 2, 18});
  EXPECT_TRUE(IsInvalidArgument(
      AttentionBackward(Make({4, 2, 6}), qkv, probs, 2, &dqkv, {0.1f, 0, 0, -1, 0}),
      {"AttentionBackward", "head_offset = -1"}));
}

TEST(AttentionTest, ErrorsNameOpAndShapes) {
  Tensor out = Make({4, 2, 6}), probs = Make({2, 2, 4, 4});
  EXPECT_TRUE(IsInvalidArgument(AttentionForward(Make({4, 2, 17}), 2, &out, &probs),
                                {"AttentionForward", "qkv", "[4, 2, 17]", "heads=2"}));
  Tensor bad_probs = Make({2, 2, 4, 5});
  Tensor out9 = Make({4, 2, 6});
  EXPECT_TRUE(IsInvalidArgument(AttentionForward(Make({4, 2, 18}), 2, &out9, &bad_probs),
                                {"AttentionForward", "probs", "expected shape [2, 2, 4, 4]"}));
  Tensor out_bad = Make({4, 2, 7});
  EXPECT_TRUE(IsInvalidArgument(AttentionForward(Make({4, 2, 18}), 2, &out_bad, &probs),
                                {"AttentionForward", "out", "expected shape [4, 2, 6]"}));
  Tensor dqkv = Make({4, 2, 12});
  EXPECT_TRUE(
      IsInvalidArgument(AttentionBackward(Make({4, 2, 6}), Make({4, 2, 18}), probs, 2, &dqkv),
                        {"AttentionBackward", "[4, 2, 18]", "[4, 2, 12]"}));
  EXPECT_TRUE(IsInvalidArgument(AttentionForward(Make({4, 18}), 2, &out, &probs),
                                {"AttentionForward", "expected rank 3"}));
  EXPECT_TRUE(IsInvalidArgument(AttentionForward(Make({4, 2, 18}), 2, &out, nullptr),
                                {"AttentionForward", "output probs is null"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
