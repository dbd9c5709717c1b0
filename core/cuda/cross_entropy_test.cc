#include "core/cuda/cross_entropy.h"

#include <cmath>

#include "core/cpu/cross_entropy.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaCrossEntropyTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  struct Case {
    int64_t n, v;
  };
  const Case cases[] = {{1, 1}, {1, 7}, {37, 129}, {4, 50257}, {300, 64}};
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (DType it : {DType::kI32, DType::kI64}) {
      for (const Case& c : cases) {
        const Tensor logits = RoundedTo(Random(Shape{c.n, c.v}, ++seed, -5.0f, 5.0f), dt);
        std::vector<int64_t> t(c.n);
        for (int64_t i = 0; i < c.n; ++i) t[i] = i % 5 == 3 ? -100 : (i * 7919 + seed) % c.v;
        const Tensor targets = Ids(Shape{c.n}, it, t);
        Tensor wl = CpuEmpty(Shape{c.n}, DType::kF32), wlse = CpuEmpty(Shape{c.n}, DType::kF32);
        absl::StatusOr<double> want = cpu::CrossEntropyForward(logits, targets, &wl, &wlse);
        ASSERT_TRUE(want.ok()) << want.status();
        const Tensor gl = ToGpu(logits, dt), gt = Upload(targets);
        Tensor losses = Poisoned(Shape{c.n}, DType::kF32), lse = Poisoned(Shape{c.n}, DType::kF32);
        absl::StatusOr<double> got = cuda::CrossEntropyForward(gl, gt, &losses, &lse);
        ASSERT_TRUE(got.ok()) << got.status();
        // f32 logits, f32 math: the expf/logf of CUDA vs the CPU's polynomials.
        EXPECT_NEAR(*got, *want, 1e-5 * std::max(1.0, std::fabs(*want)));
        EXPECT_LE(RelError(ToCpuF32(losses), wl), 1e-5);
        EXPECT_LE(RelError(ToCpuF32(lse), wlse), 1e-5);

        Tensor wd = CpuEmpty(Shape{c.n, c.v}, DType::kF32);
        LOOM_ASSERT_OK(cpu::CrossEntropyBackward(logits, targets, wlse, 0.7f, &wd));
        Tensor d = Poisoned(Shape{c.n, c.v}, dt);
        LOOM_ASSERT_OK(cuda::CrossEntropyBackward(gl, gt, Upload(wlse), 0.7f, &d));
        EXPECT_LE(RelError(ToCpuF32(d), wd), Tol(dt)) << c.n << "x" << c.v;
        // In place (dlogits aliases logits).
        Tensor inplace = ToGpu(logits, dt);
        LOOM_ASSERT_OK(cuda::CrossEntropyBackward(inplace, gt, Upload(wlse), 0.7f, &inplace));
        EXPECT_LE(RelError(ToCpuF32(inplace), wd), Tol(dt));
      }
    }
  }
}

TEST(CudaCrossEntropyTest, AllIgnoredGivesZero) {
  LOOM_REQUIRE_GPU();
  const Tensor logits = ToGpu(Random(Shape{3, 4}, 1), DType::kF32);
  const Tensor targets = Upload(Ids(Shape{3}, DType::kI64, {-1, -1, -1}));
  Tensor losses = Poisoned(Shape{3}, DType::kF32), lse = Poisoned(Shape{3}, DType::kF32);
  cpu::CrossEntropyOptions o;
  o.ignore_index = -1;
  absl::StatusOr<double> got = cuda::CrossEntropyForward(logits, targets, &losses, &lse, o);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0.0);
  Tensor d = Poisoned(Shape{3, 4}, DType::kF32);
  LOOM_ASSERT_OK(cuda::CrossEntropyBackward(logits, targets, lse, 1.0f, &d, o));
  Tensor hd = ToCpuF32(d);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(hd.data<float>()[i], 0.0f);
}

TEST(CudaCrossEntropyTest, OutOfRangeTargetIsReported) {
  LOOM_REQUIRE_GPU();
  const Tensor logits = ToGpu(Random(Shape{3, 4}, 1), DType::kF32);
  const Tensor targets = Upload(Ids(Shape{3}, DType::kI32, {0, 9, 1}));
  Tensor losses = Poisoned(Shape{3}, DType::kF32), lse = Poisoned(Shape{3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::CrossEntropyForward(logits, targets, &losses, &lse).status(),
                                {"targets[1] = 9", "[0, 4)"}));
}

TEST(CudaCrossEntropyTest, RejectsBadArguments) {
  Tensor logits = Random(Shape{3, 4}, 1);
  Tensor targets = Ids(Shape{3}, DType::kI64, {0, 1, 2});
  Tensor losses = CpuEmpty(Shape{3}, DType::kF32), lse = CpuEmpty(Shape{3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::CrossEntropyForward(logits, targets, &losses, &lse).status(),
                                {"CrossEntropyForward", "cpu"}));
  Tensor t2 = Ids(Shape{2}, DType::kI64, {0, 1});
  EXPECT_TRUE(IsInvalidArgument(cuda::CrossEntropyForward(logits, t2, &losses, &lse).status(),
                                {"one entry per row", "3 rows"}));
  Tensor tf = Random(Shape{3}, 2);
  EXPECT_TRUE(IsInvalidArgument(cuda::CrossEntropyForward(logits, tf, &losses, &lse).status(),
                                {"targets", "i32 or i64"}));
  Tensor lse16 = CpuEmpty(Shape{3}, DType::kBF16);
  Tensor d = CpuEmpty(Shape{3, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::CrossEntropyBackward(logits, targets, lse16, 1.0f, &d),
                                {"lse", "bf16"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
