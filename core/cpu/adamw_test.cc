#include "core/cpu/adamw.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu/convert.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// Several f32 steps against the same recurrence in double.
constexpr double kTol = 1e-5;

TEST(AdamWTest, StepsMatchDoubleReference) {
  const int64_t n = 1001;
  Tensor p = Random({7, 143}, 1), m = Make({n}), v = Make({n});
  const AdamWOptions o{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f};
  std::vector<double> rp = ToDouble(p), rm(n, 0.0), rv(n, 0.0);
  for (int64_t step = 1; step <= 5; ++step) {
    const Tensor g = Random({n}, 100 + step);
    LOOM_ASSERT_OK(AdamWStep(&p, g, &m, &v, step, o));
    for (int64_t i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g.data<float>()[i]) * o.grad_scale;
      rm[i] = o.beta1 * rm[i] + (1 - static_cast<double>(o.beta1)) * gi;
      rv[i] = o.beta2 * rv[i] + (1 - static_cast<double>(o.beta2)) * gi * gi;
      const double mh = rm[i] / (1 - std::pow(static_cast<double>(o.beta1), step));
      const double vh = rv[i] / (1 - std::pow(static_cast<double>(o.beta2), step));
      rp[i] -= static_cast<double>(o.lr) * (mh / (std::sqrt(vh) + o.eps) + o.weight_decay * rp[i]);
    }
  }
  EXPECT_LE(RelError(p, rp), kTol);
  EXPECT_LE(RelError(m, rm), kTol);
  EXPECT_LE(RelError(v, rv), kTol);
}

TEST(AdamWTest, FirstStepMovesByLrTimesSign) {
  // With bias correction, step 1 moves every param by ~lr * sign(g).
  Tensor p = Make({4}), m = Make({4}), v = Make({4});
  const Tensor g = FromValues({4}, {0.5f, -2.0f, 1e-3f, -7.0f});
  LOOM_ASSERT_OK(AdamWStep(&p, g, &m, &v, 1, {0.01f, 0.9f, 0.999f, 1e-12f, 0.0f, 1.0f}));
  const float want[4] = {-0.01f, 0.01f, -0.01f, 0.01f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p.data<float>()[i], want[i], 1e-6);
}

TEST(AdamWTest, ErrorsNameOpAndShapes) {
  Tensor p = Make({4}), m = Make({4}), v = Make({3});
  EXPECT_TRUE(IsInvalidArgument(AdamWStep(&p, Make({4}), &m, &v, 1, {}),
                                {"AdamWStep", "v", "expected 4 elements"}));
  Tensor v4 = Make({4});
  EXPECT_TRUE(
      IsInvalidArgument(AdamWStep(&p, Make({4}), &m, &v4, 0, {}), {"AdamWStep", "step is 0"}));
  EXPECT_TRUE(IsInvalidArgument(AdamWStep(&p, Make({4}, DType::kBF16), &m, &v4, 1, {}),
                                {"AdamWStep", "grad", "bf16"}));
}

// AdamWStepWithCopy is AdamWStep then Convert (what Optimizer::Step's
// unfused path and ParamBuffer::SyncComputeCopy do), bit for bit, at ragged
// and model-like sizes.
TEST(AdamWTest, StepWithCopyIsStepThenConvertBitwise) {
  const AdamWOptions o{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f};
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1001}, int64_t{65537}, int64_t{1} << 20}) {
    Tensor p = Random({n}, 1), m = Make({n}), v = Make({n});
    Tensor fp = Random({n}, 1), fm = Make({n}), fv = Make({n});
    Tensor want = Make({n}, DType::kBF16), copy = Make({n}, DType::kBF16);
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor g = Random({n}, 10 + step, -2.0f, 2.0f);
      LOOM_ASSERT_OK(AdamWStep(&p, g, &m, &v, step, o));
      LOOM_ASSERT_OK(Convert(p, &want));
      std::memset(copy.raw_data(), 0xff, copy.nbytes());  // poisoned: every element written
      LOOM_ASSERT_OK(AdamWStepWithCopy(&fp, g, &fm, &fv, step, o, &copy));
      ASSERT_EQ(0, std::memcmp(fp.raw_data(), p.raw_data(), p.nbytes())) << n << " step " << step;
      ASSERT_EQ(0, std::memcmp(fm.raw_data(), m.raw_data(), m.nbytes())) << n;
      ASSERT_EQ(0, std::memcmp(fv.raw_data(), v.raw_data(), v.nbytes())) << n;
      ASSERT_EQ(0, std::memcmp(copy.raw_data(), want.raw_data(), want.nbytes())) << n;
    }
  }
}

// Refused with the contract's InvalidArgument (ops::CheckParamCopy), before
// anything is updated.
TEST(AdamWTest, StepWithCopyRefusesBadCopiesBeforeUpdating) {
  Tensor p = Random({4}, 1), m = Make({4}), v = Make({4});
  const Tensor g = Random({4}, 2), before = Random({4}, 1);
  Tensor f32 = Make({4}), short16 = Make({3}, DType::kBF16), ok16 = Make({4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(AdamWStepWithCopy(&p, g, &m, &v, 1, {}, nullptr),
                                {"AdamWStepWithCopy", "param_copy is null"}));
  EXPECT_TRUE(IsInvalidArgument(AdamWStepWithCopy(&p, g, &m, &v, 1, {}, &f32),
                                {"AdamWStepWithCopy", "param_copy", "f32", "expected bf16"}));
  EXPECT_TRUE(IsInvalidArgument(AdamWStepWithCopy(&p, g, &m, &v, 1, {}, &short16),
                                {"AdamWStepWithCopy", "param_copy", "expected 4 elements"}));
  EXPECT_TRUE(IsInvalidArgument(AdamWStepWithCopy(&p, g, &m, &v, 0, {}, &ok16),
                                {"AdamWStepWithCopy", "step is 0"}));
  EXPECT_TRUE(IsInvalidArgument(AdamWStepWithCopy(&p, Make({5}), &m, &v, 1, {}, &ok16),
                                {"AdamWStepWithCopy", "grad", "expected 4 elements"}));
  EXPECT_EQ(0, std::memcmp(p.raw_data(), before.raw_data(), p.nbytes())) << "param changed";
}

}  // namespace
}  // namespace loom::core::cpu::testing
