#include "core/cpu/matmul.h"

#include <cmath>
#include <ostream>
#include <vector>

#include "core/cpu/convert.h"
#include "core/cpu/cpu_features.h"

#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// GEMM sums of K products in f32: error relative to the largest output.
constexpr double kTol = 1e-4;

// C = alpha op(A) op(B) + beta C in double; a/b/c row-major with their own shapes.
std::vector<double> RefGemm(const Tensor& a, const Tensor& b, const Tensor& c,
                            const MatmulOptions& o, int64_t a_off = 0, int64_t b_off = 0,
                            int64_t c_off = 0) {
  const int r = a.rank();
  const int64_t a0 = a.dim(r - 2), a1 = a.dim(r - 1), b1 = b.dim(r - 1);
  const int64_t m = o.trans_a ? a1 : a0, k = o.trans_a ? a0 : a1;
  const int64_t n = c.dim(r - 1);
  const std::vector<double> pa = ToDouble(a), pb = ToDouble(b), pc = ToDouble(c);
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = o.trans_a ? pa[a_off + p * a1 + i] : pa[a_off + i * a1 + p];
        const double bv = o.trans_b ? pb[b_off + j * b1 + p] : pb[b_off + p * b1 + j];
        s += av * bv;
      }
      out[i * n + j] = o.alpha * s + o.beta * pc[c_off + i * n + j];
    }
  }
  return out;
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "M=" << c.m << " N=" << c.n << " K=" << c.k << " ta=" << c.ta << " tb=" << c.tb
      << " alpha=" << c.alpha << " beta=" << c.beta;
}

class MatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulTest, MatchesDoubleReference) {
  const Case p = GetParam();
  const Tensor a = p.ta ? Random({p.k, p.m}, 1) : Random({p.m, p.k}, 1);
  const Tensor b = p.tb ? Random({p.n, p.k}, 2) : Random({p.k, p.n}, 2);
  Tensor c = Random({p.m, p.n}, 3);
  const MatmulOptions o{p.ta, p.tb, p.alpha, p.beta};
  const std::vector<double> want = RefGemm(a, b, c, o);
  LOOM_ASSERT_OK(Matmul(a, b, &c, o));
  EXPECT_LE(RelError(c, want), kTol);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulTest,
    ::testing::Values(Case{7, 5, 3, false, false, 1, 0}, Case{7, 5, 3, true, false, 1, 0},
                      Case{7, 5, 3, false, true, 1, 0}, Case{7, 5, 3, true, true, 1, 0},
                      Case{33, 65, 768, false, true, 1, 0},       // a linear layer, K = 768
                      Case{64, 48, 96, true, false, 0.5f, 1.0f},  // dW accumulate
                      Case{1, 1, 1, false, false, 2.0f, -1.0f},
                      // NT wider than 768 columns runs in slices: a ragged last
                      // one, alpha and beta on every slice.
                      Case{5, 2 * 768 + 77, 33, false, true, 0.5f, 1.0f},
                      Case{3, 768 + 1, 16, false, true, 1.0f, 0.0f},
                      Case{130, 3, 257, false, false, 1.0f, 0.25f}));

TEST(MatmulTest, BetaZeroIgnoresNaNInOutput) {
  const Tensor a = Random({4, 3}, 1), b = Random({3, 2}, 2);
  Tensor c = Make({4, 2});
  for (int i = 0; i < 8; ++i) c.data<float>()[i] = NAN;
  const std::vector<double> want = RefGemm(a, b, Make({4, 2}), {});
  LOOM_ASSERT_OK(Matmul(a, b, &c));
  EXPECT_LE(RelError(c, want), kTol);
}

TEST(MatmulTest, KZeroScalesC) {
  const Tensor a = Make({2, 0}), b = Make({0, 3});
  Tensor c = Random({2, 3}, 4);
  const std::vector<double> before = ToDouble(c);
  LOOM_ASSERT_OK(Matmul(a, b, &c, {false, false, 1.0f, 0.5f}));
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(c.data<float>()[i], 0.5 * before[i]);
}

TEST(BatchedMatmulTest, MatchesPerBatchReference) {
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const int64_t batch = 5, m = 9, n = 7, k = 11;
      const Tensor a = ta ? Random({batch, k, m}, 1) : Random({batch, m, k}, 1);
      const Tensor b = tb ? Random({batch, n, k}, 2) : Random({batch, k, n}, 2);
      Tensor c = Random({batch, m, n}, 3);
      const MatmulOptions o{ta, tb, 1.5f, 0.5f};
      std::vector<double> want;
      for (int64_t i = 0; i < batch; ++i) {
        const std::vector<double> w = RefGemm(a, b, c, o, i * m * k, i * n * k, i * m * n);
        want.insert(want.end(), w.begin(), w.end());
      }
      LOOM_ASSERT_OK(BatchedMatmul(a, b, &c, o));
      EXPECT_LE(RelError(c, want), kTol) << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(BatchedMatmulTest, Rank4AndLargeBatchesSequential) {
  // Large products go one after the other with threaded GEMMs.
  const Tensor a = Random({2, 1, 300, 200}, 1), b = Random({2, 1, 200, 310}, 2);
  Tensor c = Make({2, 1, 300, 310});
  LOOM_ASSERT_OK(BatchedMatmul(a, b, &c));
  const Tensor c_flat = *c.Reshape({2, 300, 310});
  std::vector<double> want;
  for (int64_t i = 0; i < 2; ++i) {
    const std::vector<double> w = RefGemm(*a.Reshape({2, 300, 200}), *b.Reshape({2, 200, 310}),
                                          c_flat, {}, i * 300 * 200, i * 200 * 310, i * 300 * 310);
    want.insert(want.end(), w.begin(), w.end());
  }
  EXPECT_LE(RelError(c, want), kTol);
}

TEST(MatmulTest, ErrorsNameOpAndShapes) {
  const Tensor a = Make({2, 3}), b = Make({4, 5});
  Tensor c = Make({2, 5});
  EXPECT_TRUE(IsInvalidArgument(Matmul(a, b, &c),
                                {"Matmul", "f32[2, 3] cpu", "f32[4, 5] cpu", "inner dims 3 vs 4"}));
  Tensor bad_c = Make({3, 3});
  const Tensor b2 = Make({3, 5});
  EXPECT_TRUE(IsInvalidArgument(Matmul(a, b2, &bad_c), {"Matmul", "c is", "expected [2, 5]"}));
  const Tensor ai = Make({2, 3}, DType::kI32);
  EXPECT_TRUE(IsInvalidArgument(Matmul(ai, b2, &c), {"Matmul", "a", "i32", "expected dtype f32"}));
  const Tensor a3 = Make({1, 2, 3});
  EXPECT_TRUE(IsInvalidArgument(Matmul(a3, b2, &c), {"Matmul", "expected rank 2"}));
  EXPECT_TRUE(IsInvalidArgument(Matmul(a, b2, nullptr), {"Matmul", "null"}));
  EXPECT_TRUE(IsInvalidArgument(Matmul(Tensor(), b2, &c), {"Matmul", "undefined"}));
  Tensor cb = Make({2, 2, 5});
  EXPECT_TRUE(IsInvalidArgument(BatchedMatmul(Make({3, 2, 3}), Make({2, 3, 5}), &cb),
                                {"BatchedMatmul", "batch dim 0"}));
  EXPECT_TRUE(IsInvalidArgument(BatchedMatmul(a, b2, &c), {"BatchedMatmul", "rank 3"}));
}

// ---------------------------------------------------------------- bf16

// bf16 has 8 significant bits: rounding an operand moves it by at most
// u = 2^-8 relative. A product's error is then <= 2u of |a·b|; summed over K
// products with random signs the error grows like sqrt(K) while the largest
// output grows like sqrt(K) too, but the worst case (aligned signs) grows like
// K / sqrt(K) = sqrt(K) relative to the largest output: the bound scales with
// sqrt(K), from 2u at K <= 16.
double Bf16Tol(int64_t k) { return 2.0 * std::ldexp(1.0, -8) * std::max(1.0, std::sqrt(k / 16.0)); }

// `t` rounded to bf16 (a bf16 tensor of the same shape).
Tensor ToBf16(const Tensor& t) {
  Tensor out = Make(t.shape(), DType::kBF16);
  EXPECT_TRUE(Convert(t, &out).ok());
  return out;
}

// `t` rounded to bf16 and back: the operand the bf16 GEMM really multiplies.
Tensor RoundedF32(const Tensor& t) {
  Tensor out = Make(t.shape());
  EXPECT_TRUE(Convert(ToBf16(t), &out).ok());
  return out;
}

bool HasBf16() { return CheckBf16GemmSupport("test").ok(); }

class MatmulBf16Test : public ::testing::TestWithParam<Case> {};

// Three ways in (f32 operands with opts.bf16, a bf16 weight, both bf16):
// each matches the double product of the bf16-rounded operands to f32
// accumulation accuracy, and the exact f32 product within Bf16Tol(K).
TEST_P(MatmulBf16Test, MatchesReferences) {
  if (!HasBf16()) GTEST_SKIP() << CheckBf16GemmSupport("bf16 GEMM");
  const Case p = GetParam();
  const Tensor a = p.ta ? Random({p.k, p.m}, 1) : Random({p.m, p.k}, 1);
  const Tensor b = p.tb ? Random({p.n, p.k}, 2) : Random({p.k, p.n}, 2);
  const Tensor c0 = Random({p.m, p.n}, 3);
  MatmulOptions o{p.ta, p.tb, p.alpha, p.beta};
  const std::vector<double> exact = RefGemm(a, b, c0, o);
  const std::vector<double> rounded = RefGemm(RoundedF32(a), RoundedF32(b), c0, o);
  for (int mode = 0; mode < 3; ++mode) {
    Tensor c = c0.Clone().value();
    MatmulOptions om = o;
    om.bf16 = mode == 0;
    const Tensor am = mode == 2 ? ToBf16(a) : a;
    const Tensor bm = mode == 0 ? b : ToBf16(b);
    LOOM_ASSERT_OK(Matmul(am, bm, &c, om));
    EXPECT_LE(RelError(c, rounded), kTol) << "mode " << mode;
    EXPECT_LE(RelError(c, exact), Bf16Tol(p.k)) << "mode " << mode;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulBf16Test,
    ::testing::Values(Case{7, 5, 3, false, false, 1, 0}, Case{7, 5, 3, true, false, 1, 0},
                      Case{7, 5, 3, false, true, 1, 0}, Case{7, 5, 3, true, true, 1, 0},
                      Case{64, 96, 768, false, true, 1, 0},      // Linear forward, K = 768
                      Case{64, 768, 96, false, false, 1, 0},     // Linear dX = dY·W
                      Case{96, 80, 128, true, false, 1.0f, 1.0f},  // Linear dW += dYᵀ·X
                      Case{33, 17, 3072, false, true, 0.5f, 0.25f},
                      Case{1, 1, 1, false, false, 2.0f, -1.0f}));

TEST(MatmulBf16Test, Bf16OutputRoundsTheF32Sum) {
  if (!HasBf16()) GTEST_SKIP() << CheckBf16GemmSupport("bf16 GEMM");
  const Tensor a = ToBf16(Random({16, 64}, 1)), b = ToBf16(Random({64, 24}, 2));
  Tensor want = Make({16, 24});
  LOOM_ASSERT_OK(Matmul(a, b, &want));  // f32 result
  Tensor got = Make({16, 24}, DType::kBF16);
  LOOM_ASSERT_OK(Matmul(a, b, &got));
  for (int64_t i = 0; i < want.numel(); ++i) {
    EXPECT_EQ(static_cast<const uint16_t*>(got.raw_data())[i], FloatToBf16Bits(want.data<float>()[i])) << i;
  }
}

TEST(MatmulBf16Test, BetaZeroIgnoresNaNInOutput) {
  if (!HasBf16()) GTEST_SKIP() << CheckBf16GemmSupport("bf16 GEMM");
  const Tensor a = Random({4, 3}, 1), b = Random({3, 2}, 2);
  Tensor c = Make({4, 2});
  for (int i = 0; i < 8; ++i) c.data<float>()[i] = NAN;
  MatmulOptions o;
  o.bf16 = true;
  LOOM_ASSERT_OK(Matmul(a, b, &c, o));
  EXPECT_LE(RelError(c, RefGemm(RoundedF32(a), RoundedF32(b), Make({4, 2}), {})), kTol);
}

// Every machine: a CPU without AVX512_BF16/AMX-BF16 refuses bf16 GEMMs with
// the instruction sets' names instead of computing something slow or wrong.
TEST(MatmulBf16Test, WithoutBf16HardwareTheErrorNamesTheInstructionSets) {
  HideBf16ForTesting(true);
  Tensor c = Make({2, 2});
  MatmulOptions o;
  o.bf16 = true;
  const absl::Status st = Matmul(Random({2, 3}, 1), Random({3, 2}, 2), &c, o);
  HideBf16ForTesting(false);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("AVX512_BF16 or AMX-BF16"), std::string::npos) << st;
}

}  // namespace
}  // namespace loom::core::cpu::testing
