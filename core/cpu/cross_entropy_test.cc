#include "core/cpu/cross_entropy.h"

#include <cmath>
#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

TEST(CrossEntropyTest, ForwardMatchesDoubleReference) {
  const int64_t n = 6, v = 50257;  // the GPT-2 vocab
  const Tensor logits = Random({n, v}, 1, -10.0f, 10.0f);
  const Tensor targets = Ids({6}, DType::kI32, {0, 50256, 17, -100, 3, 40000});
  Tensor losses = Make({n}), lse = Make({n});
  absl::StatusOr<double> mean = CrossEntropyForward(logits, targets, &losses, &lse);
  ASSERT_TRUE(mean.ok()) << mean.status();
  const std::vector<double> x = ToDouble(logits);
  std::vector<double> want_loss(n), want_lse(n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, x[i * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[i * v + j] - mx);
    want_lse[i] = mx + std::log(s);
    const int t = targets.data<int32_t>()[i];
    want_loss[i] = t == -100 ? 0.0 : want_lse[i] - x[i * v + t];
    total += want_loss[i];
  }
  EXPECT_LE(RelError(losses, want_loss), kFwdTol);
  EXPECT_LE(RelError(lse, want_lse), kFwdTol);
  EXPECT_NEAR(*mean, total / 5, kFwdTol * std::fabs(total / 5));
}

TEST(CrossEntropyTest, FusedBackwardMatchesFiniteDifferences) {
  const int64_t n = 5, v = 13;
  Tensor logits = Random({n, v}, 1, -3.0f, 3.0f);
  const Tensor targets = Ids({5}, DType::kI64, {4, 0, 12, -100, 7});
  Tensor losses = Make({n}), lse = Make({n});
  const float dloss = 1.7f;
  auto loss = [&] { return dloss * *CrossEntropyForward(logits, targets, &losses, &lse); };
  loss();
  Tensor dlogits = Make({n, v});
  LOOM_ASSERT_OK(CrossEntropyBackward(logits, targets, lse, dloss, &dlogits));
  for (uint64_t seed : {2, 3, 4}) {
    const Tensor dir = Random({n, v}, seed);
    const double fd = DirectionalDerivative(logits, dir, kFdEps, loss);
    EXPECT_NEAR(Dot(dlogits, dir), fd, kGradTol * std::fabs(fd) + 1e-5);
  }
  for (int64_t j = 0; j < v; ++j) EXPECT_EQ(dlogits.data<float>()[3 * v + j], 0.0f);  // ignored
  // In place (dlogits aliases logits) gives the same values. The finite
  // differences left lse at a perturbed point: recompute it at `logits`.
  loss();
  Tensor inplace = Copy(logits);
  LOOM_ASSERT_OK(CrossEntropyBackward(inplace, targets, lse, dloss, &inplace));
  for (int64_t i = 0; i < n * v; ++i) {
    EXPECT_EQ(inplace.data<float>()[i], dlogits.data<float>()[i]) << i;
  }
}

TEST(CrossEntropyTest, AllIgnoredGivesZero) {
  const Tensor logits = Random({2, 3}, 1);
  Tensor losses = Make({2}), lse = Make({2}), d = Make({2, 3});
  const Tensor t = Ids({2}, DType::kI32, {-100, -100});
  absl::StatusOr<double> mean = CrossEntropyForward(logits, t, &losses, &lse);
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ(*mean, 0.0);
  LOOM_ASSERT_OK(CrossEntropyBackward(logits, t, lse, 1.0f, &d));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(d.data<float>()[i], 0.0f);
}

TEST(CrossEntropyTest, ErrorsNameOpAndShapes) {
  Tensor losses = Make({2}), lse = Make({2});
  EXPECT_TRUE(IsInvalidArgument(
      CrossEntropyForward(Make({2, 5}), Ids({2}, DType::kI32, {1, 5}), &losses, &lse).status(),
      {"CrossEntropyForward", "targets[1] = 5", "[0, 5)", "f32[2, 5]"}));
  EXPECT_TRUE(IsInvalidArgument(
      CrossEntropyForward(Make({2, 5}), Ids({3}, DType::kI32, {1, 2, 3}), &losses, &lse).status(),
      {"CrossEntropyForward", "targets", "one entry per row", "2 rows"}));
  Tensor lse3 = Make({3});
  EXPECT_TRUE(IsInvalidArgument(
      CrossEntropyForward(Make({2, 5}), Ids({2}, DType::kI32, {1, 2}), &losses, &lse3).status(),
      {"CrossEntropyForward", "lse", "expected 2 elements"}));
  Tensor d = Make({2, 4});
  EXPECT_TRUE(IsInvalidArgument(
      CrossEntropyBackward(Make({2, 5}), Ids({2}, DType::kI32, {1, 2}), lse, 1.0f, &d),
      {"CrossEntropyBackward", "[2, 5]", "[2, 4]"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
