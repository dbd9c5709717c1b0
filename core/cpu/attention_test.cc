#include "core/cpu/attention.h"

#include <cmath>
#include <ostream>
#include <vector>

#include "core/cpu/philox.h"
#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// Naive causal attention in double over the documented layouts.
void RefAttention(const Tensor& qkv, int64_t heads, std::vector<double>* out,
                  std::vector<double>* probs) {
  const int64_t s = qkv.dim(0), b = qkv.dim(1), d = qkv.dim(2) / (3 * heads);
  const std::vector<double> x = ToDouble(qkv);
  auto at = [&](int64_t t, int64_t bi, int64_t h, int64_t which, int64_t e) {
    return x[((t * b + bi) * heads + h) * 3 * d + which * d + e];
  };
  out->assign(s * b * heads * d, 0.0);
  probs->assign(b * heads * s * s, 0.0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> sc(i + 1);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += at(i, bi, h, 0, e) * at(j, bi, h, 1, e);
          sc[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += sc[j] = std::exp(sc[j] - mx);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = sc[j] / sum;
          (*probs)[((bi * heads + h) * s + i) * s + j] = p;
          for (int64_t e = 0; e < d; ++e) {
            (*out)[((i * b + bi) * heads + h) * d + e] += p * at(j, bi, h, 2, e);
          }
        }
      }
    }
  }
}

struct Case {
  int64_t s, b, heads, d;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "s=" << c.s << " b=" << c.b << " heads=" << c.heads << " d=" << c.d;
}

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, ForwardMatchesDoubleReference) {
  const Case c = GetParam();
  const Tensor qkv = Random({c.s, c.b, c.heads * 3 * c.d}, 1, -2.0f, 2.0f);
  Tensor out = Make({c.s, c.b, c.heads * c.d}), probs = Make({c.b, c.heads, c.s, c.s});
  LOOM_ASSERT_OK(AttentionForward(qkv, c.heads, &out, &probs));
  std::vector<double> want_out, want_probs;
  RefAttention(qkv, c.heads, &want_out, &want_probs);
  EXPECT_LE(RelError(out, want_out), kFwdTol);
  EXPECT_LE(RelError(probs, want_probs), kFwdTol);
}

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  const Case c = GetParam();
  Tensor qkv = Random({c.s, c.b, c.heads * 3 * c.d}, 1, -1.0f, 1.0f);
  const Tensor w = Random({c.s, c.b, c.heads * c.d}, 2);
  Tensor out = Make({c.s, c.b, c.heads * c.d}), probs = Make({c.b, c.heads, c.s, c.s});
  auto loss = [&] {
    EXPECT_TRUE(AttentionForward(qkv, c.heads, &out, &probs).ok());
    return Dot(out, w);
  };
  loss();
  Tensor dqkv = Random(qkv.shape(), 9);  // overwritten
  LOOM_ASSERT_OK(AttentionBackward(w, qkv, probs, c.heads, &dqkv));
  for (uint64_t seed : {3, 4}) {
    const Tensor dir = Random(qkv.shape(), seed);
    const double fd = DirectionalDerivative(qkv, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dqkv, dir), fd, kGradTol * std::fabs(fd) + 1e-4);
  }
  // Separately along q, k and v only (a direction zero elsewhere).
  for (int which = 0; which < 3; ++which) {
    Tensor dir = Random(qkv.shape(), 20 + which);
    float* p = dir.data<float>();
    for (int64_t i = 0; i < dir.numel(); ++i) {
      if ((i % (3 * c.d)) / c.d != which) p[i] = 0.0f;
    }
    const double fd = DirectionalDerivative(qkv, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dqkv, dir), fd, kGradTol * std::fabs(fd) + 1e-4) << "q/k/v " << which;
  }
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
  Tensor out = Make({s, b, heads * d}), probs = Make({b, heads, s, s});
  LOOM_ASSERT_OK(AttentionForward(qkv, heads, &out, &probs));
  Tensor qkv_r = Make({s, b, local * 3 * d});
  for (int64_t t = 0; t < s * b; ++t) {
    for (int64_t e = 0; e < local * 3 * d; ++e) {
      qkv_r.data<float>()[t * local * 3 * d + e] = qkv.data<float>()[t * heads * 3 * d + 3 * d + e];
    }
  }
  Tensor out_r = Make({s, b, local * d}), probs_r = Make({b, local, s, s});
  LOOM_ASSERT_OK(AttentionForward(qkv_r, local, &out_r, &probs_r));
  for (int64_t t = 0; t < s * b; ++t) {
    for (int64_t e = 0; e < local * d; ++e) {
      EXPECT_FLOAT_EQ(out_r.data<float>()[t * local * d + e],
                      out.data<float>()[t * heads * d + d + e]);
    }
  }
}

// ---------------------------------------------------------------- dropout ----

// Backward with dropout on, against central differences: the mask is a fixed
// function of (seed, offset, index), so the loss is a smooth function of qkv.
TEST_P(AttentionTest, DropoutBackwardMatchesFiniteDifferences) {
  const Case c = GetParam();
  const AttentionDropout dr{0.3f, 11, 22, 0, 0};
  Tensor qkv = Random({c.s, c.b, c.heads * 3 * c.d}, 1, -1.0f, 1.0f);
  const Tensor w = Random({c.s, c.b, c.heads * c.d}, 2);
  Tensor out = Make({c.s, c.b, c.heads * c.d}), probs = Make({c.b, c.heads, c.s, c.s});
  auto loss = [&] {
    EXPECT_TRUE(AttentionForward(qkv, c.heads, &out, &probs, dr).ok());
    return Dot(out, w);
  };
  loss();
  Tensor dqkv = Random(qkv.shape(), 9);  // overwritten
  LOOM_ASSERT_OK(AttentionBackward(w, qkv, probs, c.heads, &dqkv, dr));
  for (int which = -1; which < 3; ++which) {  // all of qkv, then q, k, v alone
    Tensor dir = Random(qkv.shape(), 30 + which);
    float* p = dir.data<float>();
    for (int64_t i = 0; i < dir.numel(); ++i) {
      if (which >= 0 && (i % (3 * c.d)) / c.d != which) p[i] = 0.0f;
    }
    const double fd = DirectionalDerivative(qkv, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dqkv, dir), fd, kGradTol * std::fabs(fd) + 1e-4) << "direction " << which;
  }
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
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t bi = 0; bi < b; ++bi) {
        for (int64_t h = 0; h < heads; ++h) {
          float* v = qkv.data<float>() + ((t * b + bi) * heads + h) * 3 * d + 2 * d;
          for (int64_t e = 0; e < d; ++e) v[e] = e == t ? 1.0f : 0.0f;
        }
      }
    }
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
  const int64_t s = 150, b = 2, heads = 4, d = 5, local = 2, first = 2;
  const AttentionDropout full_dr{0.2f, 3, 9, 0, 0};
  const AttentionDropout rank_dr{0.2f, 3, 9, first, heads};
  const Tensor qkv = Random({s, b, heads * 3 * d}, 1);
  const Tensor dout = Random({s, b, heads * d}, 2);
  Tensor out = Make({s, b, heads * d}), probs = Make({b, heads, s, s});
  Tensor dqkv = Make({s, b, heads * 3 * d});
  LOOM_ASSERT_OK(AttentionForward(qkv, heads, &out, &probs, full_dr));
  LOOM_ASSERT_OK(AttentionBackward(dout, qkv, probs, heads, &dqkv, full_dr));
  Tensor qkv_r = Make({s, b, local * 3 * d}), dout_r = Make({s, b, local * d});
  for (int64_t t = 0; t < s * b; ++t) {
    for (int64_t e = 0; e < local * 3 * d; ++e) {
      qkv_r.data<float>()[t * local * 3 * d + e] =
          qkv.data<float>()[t * heads * 3 * d + first * 3 * d + e];
    }
    for (int64_t e = 0; e < local * d; ++e) {
      dout_r.data<float>()[t * local * d + e] = dout.data<float>()[t * heads * d + first * d + e];
    }
  }
  Tensor out_r = Make({s, b, local * d}), probs_r = Make({b, local, s, s});
  Tensor dqkv_r = Make({s, b, local * 3 * d});
  LOOM_ASSERT_OK(AttentionForward(qkv_r, local, &out_r, &probs_r, rank_dr));
  LOOM_ASSERT_OK(AttentionBackward(dout_r, qkv_r, probs_r, local, &dqkv_r, rank_dr));
  for (int64_t t = 0; t < s * b; ++t) {
    for (int64_t e = 0; e < local * d; ++e) {
      ASSERT_EQ(out_r.data<float>()[t * local * d + e],
                out.data<float>()[t * heads * d + first * d + e])
          << "out, token " << t << " e " << e;
    }
    for (int64_t e = 0; e < local * 3 * d; ++e) {
      ASSERT_EQ(dqkv_r.data<float>()[t * local * 3 * d + e],
                dqkv.data<float>()[t * heads * 3 * d + first * 3 * d + e])
          << "dqkv, token " << t << " e " << e;
    }
  }
  // The rank's mask is not the one of heads [0, 2): head_offset matters.
  Tensor out_0 = Make({s, b, local * d});
  LOOM_ASSERT_OK(AttentionForward(qkv_r, local, &out_0, &probs_r, full_dr));
  EXPECT_GT(RelError(out_0, ToDouble(out_r)), 1e-3);
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
  for (int64_t i = 0; i < out0.numel(); ++i) ASSERT_EQ(out0.data<float>()[i], out1.data<float>()[i]);
  for (int64_t i = 0; i < probs0.numel(); ++i) {
    ASSERT_EQ(probs0.data<float>()[i], probs1.data<float>()[i]);
  }
  for (int64_t i = 0; i < dqkv0.numel(); ++i) {
    ASSERT_EQ(dqkv0.data<float>()[i], dqkv1.data<float>()[i]);
  }
  // And with p > 0 probs are still the pre-dropout softmax.
  const AttentionDropout on{0.5f, 123, 456, 0, 0};
  LOOM_ASSERT_OK(AttentionForward(qkv, heads, &out1, &probs1, on));
  for (int64_t i = 0; i < probs0.numel(); ++i) {
    ASSERT_EQ(probs0.data<float>()[i], probs1.data<float>()[i]);
  }
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
}

}  // namespace
}  // namespace loom::core::cpu::testing
