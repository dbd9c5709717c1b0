// ResidualNormForward/Backward against the unfused kernels composed as the
// transformer block composed them (DropoutForward in place, Add, the norm;
// the norm's backward, Add, DropoutBackward of a copy): bit for bit.

#include "core/cpu/residual_norm.h"

#include <cstring>

#include "core/cpu/dropout.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/layernorm.h"
#include "core/cpu/rmsnorm.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu {
namespace {

using testing::Copy;
using testing::IsInvalidArgument;
using testing::Make;
using testing::Random;

bool Bitwise(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Case {
  Shape shape;
  bool rms;
  float p;
  ops::GlobalIndex where;
};

ResidualNormOptions Options(const Case& k) {
  ResidualNormOptions o;
  o.rms = k.rms;
  o.eps = k.rms ? 1e-6f : 1e-5f;
  o.dropout.p = k.p;
  o.dropout.seed = 42;
  o.dropout.offset = 9;
  o.where = k.where;
  return o;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // Ragged widths (not multiples of 8 or 16), model widths, an SP/CP-style
  // row block at a global offset, a TP-style column slice (row_stride > C).
  const Shape shapes[] = {Shape{1, 1}, Shape{3, 7}, Shape{4, 2, 33}, Shape{5, 100},
                          Shape{8, 2, 768}, Shape{2, 3, 1029}};
  for (const Shape& s : shapes) {
    const int64_t c = s.dim(s.rank() - 1);
    for (bool rms : {false, true}) {
      for (float p : {0.0f, 0.1f, 0.5f}) {
        cases.push_back({s, rms, p, {}});
        cases.push_back({s, rms, p, {17 * c + 3, 0}});
        cases.push_back({s, rms, p, {5, 3 * c + 1}});
      }
    }
  }
  return cases;
}

TEST(ResidualNormTest, ForwardIsDropoutAddNormBitwise) {
  uint64_t seed = 1;
  for (const Case& k : Cases()) {
    const ResidualNormOptions o = Options(k);
    const int64_t c = k.shape.dim(k.shape.rank() - 1), rows = k.shape.numel() / c;
    const Tensor x = Random(k.shape, ++seed, -2.0f, 2.0f), branch = Random(k.shape, ++seed);
    const Tensor gamma = Random(Shape{c}, ++seed, 0.5f, 1.5f), beta = Random(Shape{c}, ++seed);
    // The unfused path of TransformerBlock::Forward.
    Tensor a = Copy(branch);
    if (k.p > 0.0f) LOOM_ASSERT_OK(DropoutForward(a, &a, o.dropout, o.where));
    LOOM_ASSERT_OK(Add(a, x, &a));
    Tensor want = Make(k.shape), wm = Make(Shape{rows}), wr = Make(Shape{rows});
    if (k.rms) {
      LOOM_ASSERT_OK(RmsNormForward(a, gamma, o.eps, &want, &wr));
    } else {
      LOOM_ASSERT_OK(LayerNormForward(a, gamma, beta, o.eps, &want, &wm, &wr));
    }
    Tensor resid = Make(k.shape), out = Make(k.shape), mean = Make(Shape{rows}),
           rstd = Make(Shape{rows});
    LOOM_ASSERT_OK(ResidualNormForward(x, branch, gamma, k.rms ? Tensor() : beta, o, &resid, &out,
                                       k.rms ? nullptr : &mean, &rstd));
    const std::string what = k.shape.ToString() + (k.rms ? " rms" : " ln") +
                             " p=" + std::to_string(k.p) +
                             " first=" + std::to_string(k.where.first_index);
    EXPECT_TRUE(Bitwise(resid, a)) << what;
    EXPECT_TRUE(Bitwise(out, want)) << what;
    EXPECT_TRUE(Bitwise(rstd, wr)) << what;
    if (!k.rms) {
      EXPECT_TRUE(Bitwise(mean, wm)) << what;
    }
    // In place: resid in the branch's storage (what the block does), and in x's.
    Tensor in_branch = Copy(branch), out2 = Make(k.shape);
    LOOM_ASSERT_OK(ResidualNormForward(x, in_branch, gamma, k.rms ? Tensor() : beta, o,
                                       &in_branch, &out2, k.rms ? nullptr : &mean, &rstd));
    EXPECT_TRUE(Bitwise(in_branch, a)) << what;
    EXPECT_TRUE(Bitwise(out2, want)) << what;
    Tensor in_x = Copy(x);
    LOOM_ASSERT_OK(ResidualNormForward(in_x, branch, gamma, k.rms ? Tensor() : beta, o, &in_x,
                                       &out2, k.rms ? nullptr : &mean, &rstd));
    EXPECT_TRUE(Bitwise(in_x, a)) << what;
  }
}

TEST(ResidualNormTest, BackwardIsNormBackwardAddDropoutBitwise) {
  uint64_t seed = 100;
  for (const Case& k : Cases()) {
    const ResidualNormOptions o = Options(k);
    const int64_t c = k.shape.dim(k.shape.rank() - 1), rows = k.shape.numel() / c;
    const Tensor resid = Random(k.shape, ++seed, -2.0f, 2.0f);
    const Tensor gamma = Random(Shape{c}, ++seed, 0.5f, 1.5f), beta = Random(Shape{c}, ++seed);
    Tensor normed = Make(k.shape), mean = Make(Shape{rows}), rstd = Make(Shape{rows});
    if (k.rms) {
      LOOM_ASSERT_OK(RmsNormForward(resid, gamma, o.eps, &normed, &rstd));
    } else {
      LOOM_ASSERT_OK(LayerNormForward(resid, gamma, beta, o.eps, &normed, &mean, &rstd));
    }
    const Tensor dout = Random(k.shape, ++seed), dresid = Random(k.shape, ++seed);
    const Tensor dg0 = Random(Shape{c}, ++seed), db0 = Random(Shape{c}, ++seed);
    // The unfused path of TransformerBlock::Backward.
    Tensor want_dx = Make(k.shape), want_dg = Copy(dg0), want_db = Copy(db0);
    if (k.rms) {
      LOOM_ASSERT_OK(RmsNormBackward(dout, resid, gamma, rstd, &want_dx, &want_dg));
    } else {
      LOOM_ASSERT_OK(
          LayerNormBackward(dout, resid, gamma, mean, rstd, &want_dx, &want_dg, &want_db));
    }
    LOOM_ASSERT_OK(Add(want_dx, dresid, &want_dx));
    Tensor want_branch = Copy(want_dx);
    if (k.p > 0.0f) LOOM_ASSERT_OK(DropoutBackward(want_branch, &want_branch, o.dropout, o.where));

    const Tensor m = k.rms ? Tensor() : mean;
    Tensor dx = Make(k.shape), dbranch = Make(k.shape), dg = Copy(dg0), db = Copy(db0);
    LOOM_ASSERT_OK(ResidualNormBackward(dout, dresid, resid, gamma, m, rstd, o, &dx, &dbranch,
                                        &dg, k.rms ? nullptr : &db));
    const std::string what = k.shape.ToString() + (k.rms ? " rms" : " ln") +
                             " p=" + std::to_string(k.p);
    EXPECT_TRUE(Bitwise(dx, want_dx)) << what;
    EXPECT_TRUE(Bitwise(dbranch, want_branch)) << what;
    EXPECT_TRUE(Bitwise(dg, want_dg)) << what;
    if (!k.rms) {
      EXPECT_TRUE(Bitwise(db, want_db)) << what;
    }
    // No branch gradient (the block's ln1), dx in dout's and in dresid's storage.
    Tensor in_dout = Copy(dout), dg2 = Copy(dg0), db2 = Copy(db0);
    LOOM_ASSERT_OK(ResidualNormBackward(in_dout, dresid, resid, gamma, m, rstd, o, &in_dout,
                                        nullptr, &dg2, k.rms ? nullptr : &db2));
    EXPECT_TRUE(Bitwise(in_dout, want_dx)) << what;
    EXPECT_TRUE(Bitwise(dg2, want_dg)) << what;
    Tensor in_dresid = Copy(dresid), dg3 = Copy(dg0), db3 = Copy(db0);
    LOOM_ASSERT_OK(ResidualNormBackward(dout, in_dresid, resid, gamma, m, rstd, o, &in_dresid,
                                        nullptr, &dg3, k.rms ? nullptr : &db3));
    EXPECT_TRUE(Bitwise(in_dresid, want_dx)) << what;
  }
}

TEST(ResidualNormTest, RefusesBadArguments) {
  const Tensor x = Random(Shape{4, 3}, 1), b = Random(Shape{4, 3}, 2);
  const Tensor g = Random(Shape{3}, 3), beta = Random(Shape{3}, 4);
  Tensor resid = Make(Shape{4, 3}), out = Make(Shape{4, 3}), m = Make(Shape{4}),
         r = Make(Shape{4});
  ResidualNormOptions o;
  constexpr const char* kF = "ResidualNormForward";
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormForward(x, Random(Shape{4, 4}, 5), g, beta, o, &resid, &out, &m, &r),
      {kF, "branch"}));
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, beta, o, nullptr, &out, &m, &r),
                                {kF, "resid", "null"}));
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormForward(x, b, Random(Shape{4}, 6), beta, o, &resid, &out, &m, &r), {kF, "gamma"}));
  Tensor m5 = Make(Shape{5});
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, beta, o, &resid, &out, &m5, &r),
                                {kF, "mean", "4 elements"}));
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, Tensor(), o, &resid, &out, &m, &r),
                                {kF, "LayerNorm needs beta"}));
  ResidualNormOptions rms = o;
  rms.rms = true;
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, beta, rms, &resid, &out, nullptr, &r),
                                {kF, "beta", "RMSNorm"}));
  ResidualNormOptions bad_p = o;
  bad_p.dropout.p = 1.5f;
  EXPECT_TRUE(IsInvalidArgument(ResidualNormForward(x, b, g, beta, bad_p, &resid, &out, &m, &r),
                                {kF, "p = 1.5"}));
  ResidualNormOptions bad_where = o;
  bad_where.where.row_stride = 2;
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormForward(x, b, g, beta, bad_where, &resid, &out, &m, &r), {kF, "GlobalIndex"}));

  constexpr const char* kB = "ResidualNormBackward";
  Tensor dx = Make(Shape{4, 3}), dg = Make(Shape{3}), db = Make(Shape{3});
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormBackward(x, Random(Shape{3, 4}, 7), b, g, m, r, o, &dx, nullptr, &dg, &db),
      {kB, "dresid"}));
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormBackward(x, x, b, g, m, r, o, &dx, nullptr, &dg, nullptr), {kB, "dbeta"}));
  Tensor wrong = Make(Shape{2, 6});
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormBackward(x, x, b, g, m, r, o, &dx, &wrong, &dg, &db), {kB, "dbranch"}));
  EXPECT_TRUE(IsInvalidArgument(
      ResidualNormBackward(x, x, b, g, m, r, rms, &dx, nullptr, &dg, nullptr), {kB, "mean", "RMSNorm"}));
}

}  // namespace
}  // namespace loom::core::cpu
