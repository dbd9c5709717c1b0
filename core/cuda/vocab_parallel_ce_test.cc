#include "core/cuda/vocab_parallel_ce.h"

#include "core/cpu/vocab_parallel_ce.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaVocabParallelCrossEntropyTest, ThreePassesMatchCpu) {
  LOOM_REQUIRE_GPU();
  struct Case {
    int64_t n, vp, start, valid;
  };
  // Padding columns (valid < vp), a shard holding none of the targets, a
  // GPT-2-sized shard.
  const Case cases[] = {{1, 1, 0, 1}, {37, 129, 0, 100}, {13, 64, 64, 64}, {8, 25152, 25152, 25105}};
  uint64_t seed = 3;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) {
      const cpu::VocabShard shard{c.start, c.valid, c.start + c.valid};
      const Tensor logits = RoundedTo(Random(Shape{c.n, c.vp}, ++seed, -6.0f, 6.0f), dt);
      std::vector<int64_t> t(c.n);
      for (int64_t i = 0; i < c.n; ++i) t[i] = (i * 7919 + seed) % (c.start + c.valid);
      const Tensor targets = Ids(Shape{c.n}, DType::kI32, t);

      Tensor wmax = CpuEmpty(Shape{c.n}, DType::kF32);
      LOOM_ASSERT_OK(cpu::VocabShardRowMax(logits, shard, &wmax));
      Tensor wsums = CpuEmpty(Shape{2, c.n}, DType::kF32);
      LOOM_ASSERT_OK(cpu::VocabShardSumExp(logits, targets, wmax, shard, &wsums));
      Tensor wsum = CpuEmpty(Shape{c.n}, DType::kF32);
      std::copy(wsums.data<float>(), wsums.data<float>() + c.n, wsum.data<float>());
      Tensor wd = CpuEmpty(Shape{c.n, c.vp}, DType::kF32);
      LOOM_ASSERT_OK(cpu::VocabShardCrossEntropyBackward(logits, targets, wmax, wsum, shard,
                                                         0.25f, &wd));

      const Tensor gl = ToGpu(logits, dt), gt = Upload(targets);
      Tensor max = Poisoned(Shape{c.n}, DType::kF32);
      LOOM_ASSERT_OK(cuda::VocabShardRowMax(gl, shard, &max));
      EXPECT_EQ(RelError(ToCpuF32(max), wmax), 0.0) << "the max is exact";
      Tensor sums = Poisoned(Shape{2, c.n}, DType::kF32);
      LOOM_ASSERT_OK(cuda::VocabShardSumExp(gl, gt, Upload(wmax), shard, &sums));
      EXPECT_LE(RelError(ToCpuF32(sums), wsums), 1e-5) << c.n << "x" << c.vp;
      Tensor d = Poisoned(Shape{c.n, c.vp}, dt);
      LOOM_ASSERT_OK(cuda::VocabShardCrossEntropyBackward(gl, gt, Upload(wmax), Upload(wsum),
                                                          shard, 0.25f, &d));
      EXPECT_LE(RelError(ToCpuF32(d), wd), Tol(dt)) << c.n << "x" << c.vp;
    }
  }
}

TEST(CudaVocabParallelCrossEntropyTest, RejectsBadArgumentsBeforeTouchingTheGpu) {
  const Tensor logits = Random(Shape{2, 4}, 1);  // a CPU tensor
  Tensor max = CpuEmpty(Shape{2}, DType::kF32);
  EXPECT_FALSE(cuda::VocabShardRowMax(logits, {0, 4, 4}, &max).ok());
  EXPECT_TRUE(IsInvalidArgument(cuda::VocabShardRowMax(logits, {0, 5, 8}, &max),
                                {"VocabShardRowMax"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
