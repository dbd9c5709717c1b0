#include "core/cuda/vocab_parallel_ce.h"

#include <algorithm>
#include <cstring>
#include <vector>

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

// The online forward's ops against the CPU's: the max is exact, the sums
// within f32 summation order (the GPU sums per thread with running rescales,
// the CPU in blocks), on ragged shapes, padding, a shard without targets or
// valid columns, GPT-2 rows, f32 and bf16 logits.
TEST(CudaVocabParallelCrossEntropyTest, OnlineOpsMatchCpu) {
  LOOM_REQUIRE_GPU();
  struct Case {
    int64_t n, vp, start, valid;
  };
  const Case cases[] = {{1, 1, 0, 1},   {37, 129, 0, 100},   {13, 64, 64, 64},
                        {5, 32, 96, 0}, {3, 1030, 0, 1029}, {8, 25152, 25152, 25105}};
  uint64_t seed = 5;
  for (DType dt : FloatTypes()) {
    for (const Case& c : cases) {
      const cpu::VocabShard shard{c.start, c.valid, c.start + std::max<int64_t>(c.valid, 1)};
      const Tensor logits = RoundedTo(Random(Shape{c.n, c.vp}, ++seed, -6.0f, 6.0f), dt);
      std::vector<int64_t> t(c.n);
      for (int64_t i = 0; i < c.n; ++i) t[i] = (i * 7919 + seed) % shard.vocab_size;
      const Tensor targets = Ids(Shape{c.n}, DType::kI32, t);
      Tensor wmax = CpuEmpty(Shape{c.n}, DType::kF32), wsums = CpuEmpty(Shape{2, c.n}, DType::kF32);
      LOOM_ASSERT_OK(cpu::VocabShardRowMaxSumExp(logits, targets, shard, &wmax, &wsums));

      const Tensor gl = ToGpu(logits, dt), gt = Upload(targets);
      Tensor max = Poisoned(Shape{c.n}, DType::kF32), sums = Poisoned(Shape{2, c.n}, DType::kF32);
      LOOM_ASSERT_OK(cuda::VocabShardRowMaxSumExp(gl, gt, shard, &max, &sums));
      const Tensor got_max = ToCpuF32(max);
      EXPECT_EQ(0, std::memcmp(got_max.raw_data(), wmax.raw_data(), wmax.nbytes()))
          << "the max is exact, " << c.n << "x" << c.vp;
      EXPECT_LE(RelError(ToCpuF32(sums), wsums), 1e-5) << c.n << "x" << c.vp;

      // Rescaling to a larger "global" max (another shard's), on both devices.
      Tensor gmax = CpuEmpty(Shape{c.n}, DType::kF32);
      for (int64_t i = 0; i < c.n; ++i) {
        gmax.data<float>()[i] = std::max(wmax.data<float>()[i], static_cast<float>(i % 3) * 2.5f);
      }
      Tensor wres = CpuEmpty(Shape{2, c.n}, DType::kF32);
      std::memcpy(wres.raw_data(), wsums.raw_data(), wsums.nbytes());
      LOOM_ASSERT_OK(cpu::VocabShardRescaleSums(logits, targets, wmax, gmax, shard, &wres));
      Tensor res = Upload(wsums);
      LOOM_ASSERT_OK(
          cuda::VocabShardRescaleSums(gl, gt, Upload(wmax), Upload(gmax), shard, &res));
      EXPECT_LE(RelError(ToCpuF32(res), wres), 1e-6) << c.n << "x" << c.vp;
    }
  }
}

TEST(CudaVocabParallelCrossEntropyTest, OnlineOpsRejectBadArgumentsBeforeTouchingTheGpu) {
  const Tensor logits = Random(Shape{2, 4}, 1);  // CPU tensors
  const Tensor targets = Ids(Shape{2}, DType::kI32, {1, 2});
  Tensor max = CpuEmpty(Shape{2}, DType::kF32), sums = CpuEmpty(Shape{2, 2}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(
      cuda::VocabShardRowMaxSumExp(logits, targets, {0, 5, 8}, &max, &sums),
      {"VocabShardRowMaxSumExp"}));
  EXPECT_TRUE(IsInvalidArgument(
      cuda::VocabShardRescaleSums(logits, targets, max, max, {0, 4, 4}, &sums),
      {"VocabShardRescaleSums"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
