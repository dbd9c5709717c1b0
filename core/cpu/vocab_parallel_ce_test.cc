#include "core/cpu/vocab_parallel_ce.h"

#include <cmath>
#include <vector>

#include "core/cpu/cross_entropy.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// Splits [N, V] logits into `shards` column blocks of Vp = ceil(V / shards)
// (the last padded with garbage), runs the three passes with the cross-shard
// reductions done here, and compares loss and dlogits with the unsplit kernel.
void CheckAgainstFullKernel(int64_t n, int64_t vocab, int shards) {
  const Tensor logits = Random(Shape{n, vocab}, 7, -4.0f, 4.0f);
  Tensor targets = Make(Shape{n}, DType::kI32);
  for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 5) % vocab);

  Tensor losses = Make(Shape{n}), lse = Make(Shape{n}), dfull = Make(Shape{n, vocab});
  absl::StatusOr<double> want = CrossEntropyForward(logits, targets, &losses, &lse);
  ASSERT_TRUE(want.ok()) << want.status();
  LOOM_ASSERT_OK(CrossEntropyBackward(logits, targets, lse, 1.0f, &dfull));

  const int64_t vp = (vocab + shards - 1) / shards;
  std::vector<Tensor> parts;
  std::vector<VocabShard> specs;
  for (int s = 0; s < shards; ++s) {
    Tensor part = Random(Shape{n, vp}, 100 + s, 50.0f, 60.0f);  // padding: large, must be ignored
    VocabShard shard{s * vp, std::max<int64_t>(0, std::min(vp, vocab - s * vp)), vocab};
    for (int64_t i = 0; i < n; ++i)
      for (int64_t v = 0; v < shard.valid; ++v)
        part.data<float>()[i * vp + v] = logits.data<float>()[i * vocab + shard.vocab_start + v];
    parts.push_back(part);
    specs.push_back(shard);
  }
  // max over shards (the TP all-reduce).
  Tensor max = Make(Shape{n});
  for (int64_t i = 0; i < n; ++i) max.data<float>()[i] = -INFINITY;
  for (int s = 0; s < shards; ++s) {
    Tensor m = Make(Shape{n});
    LOOM_ASSERT_OK(VocabShardRowMax(parts[s], specs[s], &m));
    for (int64_t i = 0; i < n; ++i)
      max.data<float>()[i] = std::max(max.data<float>()[i], m.data<float>()[i]);
  }
  Tensor sums = Make(Shape{2, n});
  std::vector<double> total(2 * n, 0.0);
  for (int s = 0; s < shards; ++s) {
    LOOM_ASSERT_OK(VocabShardSumExp(parts[s], targets, max, specs[s], &sums));
    for (int64_t k = 0; k < 2 * n; ++k) total[k] += sums.data<float>()[k];
  }
  double loss = 0;
  Tensor sum = Make(Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    loss += std::log(total[i]) - total[n + i];
    sum.data<float>()[i] = static_cast<float>(total[i]);
  }
  EXPECT_NEAR(loss / n, *want, 1e-5 * std::abs(*want));

  for (int s = 0; s < shards; ++s) {
    Tensor d = Make(Shape{n, vp});
    LOOM_ASSERT_OK(VocabShardCrossEntropyBackward(parts[s], targets, max, sum, specs[s],
                                                  1.0f / n, &d));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t v = 0; v < vp; ++v) {
        const float got = d.data<float>()[i * vp + v];
        if (v >= specs[s].valid) {
          ASSERT_EQ(got, 0.0f) << "padding column " << v << " of shard " << s;
        } else {
          ASSERT_NEAR(got, dfull.data<float>()[i * vocab + specs[s].vocab_start + v], 1e-6)
              << "row " << i << " shard " << s << " col " << v;
        }
      }
    }
  }
}

TEST(VocabParallelCrossEntropyTest, OneShardMatchesFullKernel) { CheckAgainstFullKernel(9, 50, 1); }
TEST(VocabParallelCrossEntropyTest, ThreeShardsWithPaddingMatchFullKernel) {
  CheckAgainstFullKernel(13, 50, 3);  // Vp = 17, last shard holds 16 real columns
}

TEST(VocabParallelCrossEntropyTest, TargetOutsideVocabularyIsAnError) {
  const Tensor logits = Random(Shape{2, 4}, 1);
  Tensor targets = Make(Shape{2}, DType::kI32);
  targets.data<int32_t>()[0] = 1;
  targets.data<int32_t>()[1] = 9;
  Tensor max = Make(Shape{2}), sums = Make(Shape{2, 2});
  const VocabShard shard{0, 4, 4};
  LOOM_ASSERT_OK(VocabShardRowMax(logits, shard, &max));
  absl::Status st = VocabShardSumExp(logits, targets, max, shard, &sums);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("target 9 at token 1"), std::string::npos) << st;
}

TEST(VocabParallelCrossEntropyTest, ShardThatDoesNotFitIsAnError) {
  const Tensor logits = Random(Shape{2, 4}, 1);
  Tensor max = Make(Shape{2});
  EXPECT_TRUE(IsInvalidArgument(VocabShardRowMax(logits, {0, 5, 8}, &max),
                                         {"VocabShardRowMax", "valid 5", "Vp 4"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
