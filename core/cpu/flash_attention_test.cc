#include "core/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cpu/attention_test_util.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// Flash vs the s x s kernel (both f32, different summation orders): a few
// f32 roundings of sums over s terms.
constexpr double kVsOldTol = 2e-5;

using Case = AttentionCase;

class FlashAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttentionTest, MatchesDoubleReference) {
  ExpectMatchesDoubleReference(AttentionSaved::kLse, GetParam());
}

TEST_P(FlashAttentionTest, MatchesTheProbsKernel) {
  const Case c = GetParam();
  const Tensor qkv = Random(c.Qkv(), 3, -2.0f, 2.0f);
  const Tensor dout = Random(c.Out(), 4);
  const AttentionRun flash = RunAttention(AttentionSaved::kLse, qkv, c.heads, c.Dropout(), &dout);
  const AttentionRun old = RunAttention(AttentionSaved::kProbs, qkv, c.heads, c.Dropout(), &dout);
  EXPECT_LE(RelError(flash.out, ToDouble(old.out)), kVsOldTol);
  EXPECT_LE(RelError(flash.dqkv, ToDouble(old.dqkv)), 5 * kVsOldTol);
}

TEST_P(FlashAttentionTest, BackwardMatchesFiniteDifferences) {
  const Case c = GetParam();
  if (c.s * c.b * c.heads * c.d > 20000) GTEST_SKIP() << "finite differences on the small cases";
  ExpectGradientMatchesFiniteDifferences(AttentionSaved::kLse, c, c.Dropout(), 5, 40);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionTest,
    ::testing::Values(Case{1, 1, 1, 4, 0.0f},      // one token
                      Case{1, 2, 2, 4, 0.5f},      // one token, dropout
                      Case{5, 2, 2, 3, 0.0f},      // pairs >= threads
                      Case{7, 1, 1, 8, 0.3f},      // one pair
                      Case{129, 2, 3, 4, 0.0f},    // one past a tile
                      Case{129, 1, 2, 16, 0.2f},   // one past a tile, dropout
                      Case{300, 1, 2, 8, 0.1f},    // several tiles, ragged end
                      Case{256, 2, 1, 64, 0.0f},   // whole tiles, GPT-2's d
                      Case{200, 1, 2, 64, 0.1f}),  // GPT-2's d, dropout
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return "s" + std::to_string(c.s) + "_b" + std::to_string(c.b) + "_h" +
             std::to_string(c.heads) + "_d" + std::to_string(c.d) + "_p" +
             std::to_string(static_cast<int>(c.p * 100));
    });

// With V = identity (d = s, v_j = e_j), out row i IS the dropped probability
// row: the flash kernel drops exactly the elements the probs kernel drops
// (zero exactly where it is zero), and keeps the rest.
TEST(FlashAttentionDropoutTest, DropsExactlyTheElementsOfTheProbsKernel) {
  const int64_t s = 150, b = 2, heads = 2, d = 150;
  const AttentionDropout dr{0.3f, 5, 77, 1, 4};  // a TP rank: heads [1, 3) of 4
  Tensor qkv = Random({s, b, heads * 3 * d}, 1, -0.5f, 0.5f);
  SetIdentityV(&qkv, heads);
  const Tensor out = RunAttention(AttentionSaved::kLse, qkv, heads, dr).out;
  const Tensor old_out = RunAttention(AttentionSaved::kProbs, qkv, heads, dr).out;
  int64_t dropped = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float got = out.data<float>()[i], want = old_out.data<float>()[i];
    ASSERT_EQ(got == 0.0f, want == 0.0f) << "element " << i;
    EXPECT_NEAR(got, want, 1e-5f * (1.0f + std::fabs(want)));
    dropped += got == 0.0f;
  }
  EXPECT_GT(dropped, out.numel() / 2);  // above the diagonal, and ~30% below
}

// A TP rank owning heads [2, 4) of 4 gets bitwise its part of the full run,
// forward and backward (each pair's result depends only on that pair).
TEST(FlashAttentionDropoutTest, TensorParallelSliceIsBitwiseTheFullRun) {
  ExpectTensorParallelSliceIsBitwiseTheFullRun(AttentionSaved::kLse);
}

// ------------------------------------------------------------- block API ----

// What context parallelism does: Q and K/V cut into chunks at global
// positions (uneven, not tile-aligned), every (Q chunk, K/V chunk) pair run
// on its own as a partial (O, lse), the partials merged by log-sum-exp in an
// arbitrary order; then the backward per chunk pair, accumulated. The result
// is the whole-sequence kernel's, dropout included.
TEST(FlashBlockTest, ChunkedPartialsMergedByLseGiveTheFullResult) {
  const int64_t s = 301, b = 2, heads = 2, d = 8;
  const AttentionDropout dr{0.2f, 7, 8, 0, 0};
  const Tensor qkv = Random({s, b, heads * 3 * d}, 1, -2.0f, 2.0f);
  const Tensor dout = Random({s, b, heads * d}, 2);
  Tensor out = Make({s, b, heads * d}), lse = Make({b, heads, s});
  Tensor dqkv = Make(qkv.shape());
  LOOM_ASSERT_OK(FlashAttentionForward(qkv, heads, &out, &lse, dr));
  LOOM_ASSERT_OK(FlashAttentionBackward(dout, qkv, out, lse, heads, &dqkv, dr));

  const std::vector<int64_t> q_cuts = {0, 70, 200, 301}, kv_cuts = {0, 90, 131, 260, 301};
  const int64_t ld_qkv = b * heads * 3 * d, ld_out = b * heads * d;
  const float* x = qkv.data<float>();
  Tensor out_c = Make(out.shape()), lse_c = Make(lse.shape()), dqkv_c = Make(qkv.shape());
  std::fill(dqkv_c.data<float>(), dqkv_c.data<float>() + dqkv_c.numel(), 0.0f);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = x + (bi * heads + h) * 3 * d;
      const int64_t pair = bi * heads + h;
      auto block = [&](int64_t qc, int64_t kc) {
        FlashBlock blk;
        blk.d = d;
        blk.q = q + q_cuts[qc] * ld_qkv;
        blk.ld_q = ld_qkv;
        blk.q_start = q_cuts[qc];
        blk.q_len = q_cuts[qc + 1] - q_cuts[qc];
        blk.k = q + d + kv_cuts[kc] * ld_qkv;
        blk.v = q + 2 * d + kv_cuts[kc] * ld_qkv;
        blk.ld_kv = ld_qkv;
        blk.k_start = kv_cuts[kc];
        blk.k_len = kv_cuts[kc + 1] - kv_cuts[kc];
        blk.seq_len = s;
        blk.global_pair = pair;
        blk.dropout = dr;
        return blk;
      };
      for (size_t qc = 0; qc + 1 < q_cuts.size(); ++qc) {
        const int64_t q0 = q_cuts[qc], ql = q_cuts[qc + 1] - q0;
        float* o = out_c.data<float>() + q0 * ld_out + pair * d;
        float* l = lse_c.data<float>() + pair * s + q0;
        for (int64_t r = 0; r < ql; ++r) {
          std::fill(o + r * ld_out, o + r * ld_out + d, 0.0f);
          l[r] = -INFINITY;
        }
        // K/V chunks last to first, each a partial of its own.
        for (int64_t kc = static_cast<int64_t>(kv_cuts.size()) - 2; kc >= 0; --kc) {
          std::vector<float> acc(ql * d), m(ql), sum(ql), o_part(ql * d), l_part(ql);
          FlashRunning st{acc.data(), d, m.data(), sum.data()};
          FlashRunningInit(ql, d, &st);
          LOOM_ASSERT_OK(FlashForwardBlock(block(qc, kc), &st));
          FlashRunningFinish(ql, d, st, o_part.data(), d, l_part.data());
          FlashMergePartial(ql, d, o_part.data(), d, l_part.data(), o, ld_out, l);
        }
      }
      // Backward with the merged (final) O and lse.
      float* dq = dqkv_c.data<float>() + (bi * heads + h) * 3 * d;
      for (size_t qc = 0; qc + 1 < q_cuts.size(); ++qc) {
        const int64_t q0 = q_cuts[qc], ql = q_cuts[qc + 1] - q0;
        std::vector<float> delta(ql);
        const float* dy = dout.data<float>() + q0 * ld_out + pair * d;
        FlashDelta(ql, d, dy, ld_out, out_c.data<float>() + q0 * ld_out + pair * d, ld_out,
                   delta.data());
        for (size_t kc = 0; kc + 1 < kv_cuts.size(); ++kc) {
          const FlashGrads g{dq + q0 * ld_qkv, ld_qkv, dq + d + kv_cuts[kc] * ld_qkv,
                             dq + 2 * d + kv_cuts[kc] * ld_qkv, ld_qkv};
          LOOM_ASSERT_OK(FlashBackwardBlock(block(qc, kc), dy, ld_out,
                                            lse_c.data<float>() + pair * s + q0, delta.data(), g));
        }
      }
    }
  }
  EXPECT_LE(RelError(out_c, ToDouble(out)), 1e-6);
  EXPECT_LE(RelError(lse_c, ToDouble(lse)), 1e-6);
  EXPECT_LE(RelError(dqkv_c, ToDouble(dqkv)), 1e-5);
}

// One running state fed the K/V chunks in any order equals the whole block.
TEST(FlashBlockTest, RunningStateOverChunksInAnyOrder) {
  const int64_t s = 200, d = 16;
  const Tensor qkv = Random({s, 1, 3 * d}, 3, -2.0f, 2.0f);
  const AttentionDropout dr{0.1f, 1, 2, 0, 0};
  const float* x = qkv.data<float>();
  auto run = [&](const std::vector<std::pair<int64_t, int64_t>>& chunks, std::vector<float>* o,
                 std::vector<float>* l) {
    std::vector<float> acc(s * d), m(s), sum(s);
    FlashRunning st{acc.data(), d, m.data(), sum.data()};
    FlashRunningInit(s, d, &st);
    for (const auto& [k0, k1] : chunks) {
      FlashBlock blk;
      blk.d = d;
      blk.q = x, blk.ld_q = 3 * d, blk.q_start = 0, blk.q_len = s;
      blk.k = x + d + k0 * 3 * d, blk.v = x + 2 * d + k0 * 3 * d, blk.ld_kv = 3 * d;
      blk.k_start = k0, blk.k_len = k1 - k0, blk.seq_len = s, blk.dropout = dr;
      LOOM_ASSERT_OK(FlashForwardBlock(blk, &st));
    }
    o->resize(s * d);
    l->resize(s);
    FlashRunningFinish(s, d, st, o->data(), d, l->data());
  };
  std::vector<float> o_full, l_full, o_parts, l_parts;
  run({{0, s}}, &o_full, &l_full);
  run({{150, 200}, {0, 37}, {37, 150}}, &o_parts, &l_parts);
  for (int64_t i = 0; i < s * d; ++i) EXPECT_NEAR(o_parts[i], o_full[i], 1e-5f) << i;
  for (int64_t i = 0; i < s; ++i) EXPECT_NEAR(l_parts[i], l_full[i], 1e-5f) << i;
}

// A query chunk that sees none of a K/V chunk (all in its future) gets the
// neutral partial (O = 0, lse = -inf), which the merge ignores.
TEST(FlashBlockTest, FullyMaskedChunkIsNeutral) {
  const int64_t d = 4, ql = 3;
  const Tensor qkv = Random({10, 1, 3 * d}, 4);
  const float* x = qkv.data<float>();
  FlashBlock blk;
  blk.d = d;
  blk.q = x, blk.ld_q = 3 * d, blk.q_start = 0, blk.q_len = ql;
  blk.k = x + d + 5 * 3 * d, blk.v = x + 2 * d + 5 * 3 * d, blk.ld_kv = 3 * d;
  blk.k_start = 5, blk.k_len = 5, blk.seq_len = 10;
  std::vector<float> acc(ql * d), m(ql), l(ql), o(ql * d, 7.0f), lse(ql, 1.0f);
  FlashRunning st{acc.data(), d, m.data(), l.data()};
  FlashRunningInit(ql, d, &st);
  LOOM_ASSERT_OK(FlashForwardBlock(blk, &st));
  FlashRunningFinish(ql, d, st, o.data(), d, lse.data());
  for (float v : o) EXPECT_EQ(v, 0.0f);
  for (float v : lse) EXPECT_EQ(v, -INFINITY);
  std::vector<float> o2(ql * d, 2.0f), lse2(ql, 0.5f);
  FlashMergePartial(ql, d, o.data(), d, lse.data(), o2.data(), d, lse2.data());
  for (float v : o2) EXPECT_EQ(v, 2.0f);
  for (float v : lse2) EXPECT_EQ(v, 0.5f);
}

TEST(FlashAttentionTest, ErrorsNameOpAndShapes) {
  Tensor out = Make({4, 2, 6}), lse = Make({2, 2, 4});
  EXPECT_TRUE(IsInvalidArgument(FlashAttentionForward(Make({4, 2, 17}), 2, &out, &lse),
                                {"FlashAttentionForward", "qkv", "[4, 2, 17]", "heads=2"}));
  Tensor bad_lse = Make({2, 2, 5});
  EXPECT_TRUE(IsInvalidArgument(FlashAttentionForward(Make({4, 2, 18}), 2, &out, &bad_lse),
                                {"FlashAttentionForward", "lse", "expected shape [2, 2, 4]"}));
  EXPECT_TRUE(IsInvalidArgument(
      FlashAttentionForward(Make({4, 2, 18}), 2, &out, &lse, {1.5f, 0, 0, 0, 0}),
      {"FlashAttentionForward", "p = 1.5"}));
  Tensor dqkv = Make({4, 2, 12});
  EXPECT_TRUE(IsInvalidArgument(
      FlashAttentionBackward(Make({4, 2, 6}), Make({4, 2, 18}), out, lse, 2, &dqkv),
      {"FlashAttentionBackward", "[4, 2, 18]", "[4, 2, 12]"}));
  Tensor dqkv_ok = Make({4, 2, 18});
  EXPECT_TRUE(IsInvalidArgument(
      FlashAttentionBackward(Make({4, 2, 6}), Make({4, 2, 18}), out, bad_lse, 2, &dqkv_ok),
      {"FlashAttentionBackward", "lse"}));
  EXPECT_TRUE(IsInvalidArgument(
      FlashAttentionBackward(Make({4, 2, 6}), Make({4, 2, 18}), Make({4, 2, 7}), lse, 2, &dqkv_ok),
      {"FlashAttentionBackward", "out", "expected shape [4, 2, 6]"}));
  EXPECT_TRUE(IsInvalidArgument(FlashAttentionForward(Make({4, 2, 18}), 2, &out, nullptr),
                                {"FlashAttentionForward", "output lse is null"}));
}

// Packed documents (AttentionDropout::doc_start): every document of a row
// gets exactly what the kernel gives it alone, forward and backward, in both
// kernels. The documents straddle the flash tiles (128 queries, 256 keys),
// one is a single token; row 1's split differs from row 0's.
class PackedDocumentsTest : public ::testing::TestWithParam<AttentionSaved> {};

// Rows [first, first + n) of batch row bi of t [s, b, w], as [n, 1, w].
Tensor RowsOf(const Tensor& t, int64_t bi, int64_t first, int64_t n) {
  const int64_t b = t.dim(1), w = t.dim(2);
  Tensor out = Make({n, 1, w});
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(t.data<float>() + ((first + i) * b + bi) * w, w, out.data<float>() + i * w);
  }
  return out;
}

TEST_P(PackedDocumentsTest, EachDocumentAsIfAlone) {
  const int64_t s = 300, b = 2, heads = 2, d = 8;
  const std::vector<std::vector<int64_t>> starts = {{0, 100, 101, 270}, {0, 260}};
  std::vector<int32_t> doc_start(b * s);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0, k = 0; i < s; ++i) {
      if (k + 1 < static_cast<int64_t>(starts[bi].size()) && i == starts[bi][k + 1]) ++k;
      doc_start[bi * s + i] = static_cast<int32_t>(starts[bi][k]);
    }
  }
  const Tensor qkv = Random({s, b, heads * 3 * d}, 5, -2.0f, 2.0f);
  const Tensor dout = Random({s, b, heads * d}, 6);
  AttentionDropout packed;
  packed.doc_start = doc_start.data();
  const AttentionRun all = RunAttention(GetParam(), qkv, heads, packed, &dout);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (size_t k = 0; k < starts[bi].size(); ++k) {
      const int64_t first = starts[bi][k];
      const int64_t n = (k + 1 < starts[bi].size() ? starts[bi][k + 1] : s) - first;
      SCOPED_TRACE(::testing::Message() << "row " << bi << ", document at " << first);
      const Tensor doc_dout = RowsOf(dout, bi, first, n);
      const AttentionRun alone =
          RunAttention(GetParam(), RowsOf(qkv, bi, first, n), heads, {}, &doc_dout);
      EXPECT_LE(RelError(RowsOf(all.out, bi, first, n), ToDouble(alone.out)), 1e-6);
      EXPECT_LE(RelError(RowsOf(all.dqkv, bi, first, n), ToDouble(alone.dqkv)), 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, PackedDocumentsTest,
                         ::testing::Values(AttentionSaved::kLse, AttentionSaved::kProbs),
                         [](const ::testing::TestParamInfo<AttentionSaved>& info) {
                           return info.param == AttentionSaved::kLse ? "flash" : "sxs";
                         });

}  // namespace
}  // namespace loom::core::cpu::testing
