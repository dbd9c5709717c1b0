// The linear-epilogue ops against their oracle, the unfused kernels they
// replace in the layers (Matmul, BiasAdd, GELU): the CPU implementation is
// that composition, so every result must be bitwise equal (tolerance 0).

#include "core/cpu/linear.h"

#include <cstring>

#include "core/cpu/elementwise.h"
#include "core/cpu/matmul.h"
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

struct Dims {
  int64_t n, k, m;  // x [n, k], w [m, k], y [n, m]
};
// Ragged shapes and one GPT-2-small-sized MLP slice (h 768 -> ffn 3072).
const Dims kDims[] = {{1, 1, 1}, {37, 19, 23}, {64, 48, 40}, {128, 768, 3072}, {5, 3072, 768}};

TEST(LinearTest, ForwardIsGemmPlusBiasBitwise) {
  uint64_t seed = 1;
  for (const Dims& d : kDims) {
    const Tensor x = Random(Shape{d.n, d.k}, seed++), w = Random(Shape{d.m, d.k}, seed++);
    const Tensor bias = Random(Shape{d.m}, seed++);
    Tensor want = Make(Shape{d.n, d.m});
    LOOM_ASSERT_OK(Matmul(x, w, &want, MatmulOptions{false, true}));
    LOOM_ASSERT_OK(BiasAddForward(want, bias, &want));
    Tensor y = Random(Shape{d.n, d.m}, 99);  // overwritten
    LOOM_ASSERT_OK(LinearForward(x, w, bias, &y, nullptr, {}));
    EXPECT_TRUE(Bitwise(y, want)) << d.n << "x" << d.k << "x" << d.m;
  }
}

TEST(LinearTest, ForwardGeluKeepsPreActivationBitwise) {
  uint64_t seed = 10;
  for (const Dims& d : kDims) {
    const Tensor x = Random(Shape{d.n, d.k}, seed++), w = Random(Shape{d.m, d.k}, seed++);
    const Tensor bias = Random(Shape{d.m}, seed++);
    Tensor want_pre = Make(Shape{d.n, d.m}), want_y = Make(Shape{d.n, d.m});
    LOOM_ASSERT_OK(Matmul(x, w, &want_pre, MatmulOptions{false, true}));
    LOOM_ASSERT_OK(BiasAddForward(want_pre, bias, &want_pre));
    LOOM_ASSERT_OK(GeluForward(want_pre, &want_y));
    Tensor y = Make(Shape{d.n, d.m}), pre = Make(Shape{d.n, d.m});
    LOOM_ASSERT_OK(LinearForward(x, w, bias, &y, &pre, LinearOptions{.gelu = true}));
    EXPECT_TRUE(Bitwise(pre, want_pre)) << d.n << "x" << d.k << "x" << d.m;
    EXPECT_TRUE(Bitwise(y, want_y)) << d.n << "x" << d.k << "x" << d.m;
  }
}

TEST(LinearTest, BackwardDataThroughGeluWithBiasGradBitwise) {
  uint64_t seed = 20;
  for (const Dims& d : kDims) {
    // dy [n, m] · w [m, k] -> dx [n, k] at the GELU input pre [n, k].
    const Tensor dy = Random(Shape{d.n, d.m}, seed++), w = Random(Shape{d.m, d.k}, seed++);
    const Tensor pre = Random(Shape{d.n, d.k}, seed++, -3.0f, 3.0f);
    const Tensor db0 = Random(Shape{d.k}, seed++);  // accumulated into
    Tensor want_dx = Make(Shape{d.n, d.k}), want_db = Copy(db0);
    LOOM_ASSERT_OK(Matmul(dy, w, &want_dx));
    LOOM_ASSERT_OK(GeluBackward(pre, want_dx, &want_dx));
    LOOM_ASSERT_OK(BiasAddBackward(want_dx, &want_db));
    Tensor dx = Random(Shape{d.n, d.k}, 98), db = Copy(db0);
    LOOM_ASSERT_OK(LinearBackwardData(dy, w, pre, &dx, &db, LinearOptions{.gelu = true}));
    EXPECT_TRUE(Bitwise(dx, want_dx)) << d.n << "x" << d.k << "x" << d.m;
    EXPECT_TRUE(Bitwise(db, want_db)) << d.n << "x" << d.k << "x" << d.m;
    // Without the bias gradient, and without GELU (a plain dX GEMM).
    Tensor dx2 = Make(Shape{d.n, d.k});
    LOOM_ASSERT_OK(LinearBackwardData(dy, w, pre, &dx2, nullptr, LinearOptions{.gelu = true}));
    EXPECT_TRUE(Bitwise(dx2, want_dx));
    Tensor plain = Make(Shape{d.n, d.k}), want_plain = Make(Shape{d.n, d.k});
    LOOM_ASSERT_OK(Matmul(dy, w, &want_plain));
    LOOM_ASSERT_OK(LinearBackwardData(dy, w, Tensor(), &plain, nullptr, {}));
    EXPECT_TRUE(Bitwise(plain, want_plain));
  }
}

TEST(LinearTest, BackwardWeightAccumulatesWithBiasGradBitwise) {
  uint64_t seed = 30;
  for (const Dims& d : kDims) {
    const Tensor dy = Random(Shape{d.n, d.m}, seed++), x = Random(Shape{d.n, d.k}, seed++);
    const Tensor dw0 = Random(Shape{d.m, d.k}, seed++), db0 = Random(Shape{d.m}, seed++);
    Tensor want_dw = Copy(dw0), want_db = Copy(db0);
    LOOM_ASSERT_OK(Matmul(dy, x, &want_dw, MatmulOptions{true, false, 1.0f, 1.0f}));
    LOOM_ASSERT_OK(BiasAddBackward(dy, &want_db));
    Tensor dw = Copy(dw0), db = Copy(db0);
    LOOM_ASSERT_OK(LinearBackwardWeight(dy, x, &dw, &db, {}));
    EXPECT_TRUE(Bitwise(dw, want_dw)) << d.n << "x" << d.k << "x" << d.m;
    EXPECT_TRUE(Bitwise(db, want_db)) << d.n << "x" << d.k << "x" << d.m;
    Tensor dw_only = Copy(dw0);
    LOOM_ASSERT_OK(LinearBackwardWeight(dy, x, &dw_only, nullptr, {}));
    EXPECT_TRUE(Bitwise(dw_only, want_dw));
  }
}

// The shared contract (core/ops/contracts/shape_checks.h): every device
// refuses these with the same InvalidArgument.
TEST(LinearTest, RejectsBadArguments) {
  const Tensor x = Random(Shape{4, 3}, 1), w = Random(Shape{5, 3}, 2), b = Random(Shape{5}, 3);
  Tensor y = Make(Shape{4, 5}), pre = Make(Shape{4, 5});
  const LinearOptions gelu{.gelu = true};
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, nullptr, nullptr, {}),
                                {"LinearForward", "y", "null"}));
  Tensor bad_y = Make(Shape{4, 6});
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, &bad_y, nullptr, {}),
                                {"LinearForward", "y", "[4, 5]"}));
  const Tensor bad_x = Random(Shape{4, 2}, 4);
  EXPECT_TRUE(IsInvalidArgument(LinearForward(bad_x, w, b, &y, nullptr, {}),
                                {"LinearForward", "x", "[4, 3]"}));
  const Tensor bad_b = Random(Shape{4}, 5);
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, bad_b, &y, nullptr, {}),
                                {"LinearForward", "bias", "[5]"}));
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, &y, nullptr, gelu),
                                {"LinearForward", "pre", "null"}));
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, &y, &pre, {}),
                                {"LinearForward", "pre", "only with gelu"}));
  EXPECT_TRUE(IsInvalidArgument(LinearForward(x, w, b, &y, &y, gelu),
                                {"LinearForward", "share storage"}));

  const Tensor dy = Random(Shape{4, 5}, 6);
  Tensor dx = Make(Shape{4, 3}), db3 = Make(Shape{3});
  const Tensor pre_dx = Random(Shape{4, 3}, 7);
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardData(dy, w, pre_dx, &dx, &db3, {}),
                                {"LinearBackwardData", "dbias", "needs gelu"}));
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardData(dy, w, pre, &dx, &db3, gelu),
                                {"LinearBackwardData", "pre", "[4, 3]"}));
  Tensor db_bad = Make(Shape{5});
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardData(dy, w, pre_dx, &dx, &db_bad, gelu),
                                {"LinearBackwardData", "dbias", "[3]"}));
  const Tensor dy_rows = Random(Shape{3, 5}, 8);
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardData(dy_rows, w, pre_dx, &dx, nullptr, gelu),
                                {"LinearBackwardData", "same rows"}));

  Tensor dw = Make(Shape{5, 3}), db5 = Make(Shape{5});
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardWeight(dy, x, &dw, &db5, gelu),
                                {"LinearBackwardWeight", "gelu"}));
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardWeight(dy, x, &dw, &db3, {}),
                                {"LinearBackwardWeight", "dbias", "[5]"}));
  Tensor dw_bad = Make(Shape{3, 5});
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardWeight(dy, x, &dw_bad, nullptr, {}),
                                {"LinearBackwardWeight", "dw", "[5, 3]"}));
  EXPECT_TRUE(IsInvalidArgument(LinearBackwardWeight(dy, x, nullptr, nullptr, {}),
                                {"LinearBackwardWeight", "dw", "null"}));
}

}  // namespace
}  // namespace loom::core::cpu
