#include "core/cpu/vocab_parallel_ce.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

// ---- the "online" forward: VocabShardRowMaxSumExp + VocabShardRescaleSums

Tensor Targets(int64_t n, int64_t vocab, uint64_t seed) {
  Tensor t = Make(Shape{n}, DType::kI32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7919 + seed) % vocab);
  return t;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// One shard's local passes: the same max and sums as VocabShardRowMax then
// VocabShardSumExp against that max, bit for bit (ragged and GPT-2 rows,
// padding, a shard holding no target, a shard with no valid column).
TEST(VocabParallelCrossEntropyTest, RowMaxSumExpIsTheTwoLocalPassesBitwise) {
  struct Case {
    int64_t n, vp, start, valid;
  };
  const Case cases[] = {{1, 1, 0, 1},      {37, 129, 0, 100},  {13, 64, 64, 64},
                        {5, 32, 96, 0},    {3, 1030, 0, 1029}, {4, 50304, 0, 50257}};
  uint64_t seed = 3;
  for (const Case& c : cases) {
    const VocabShard shard{c.start, c.valid, std::max<int64_t>(c.start + c.valid, 1)};
    const Tensor logits = Random(Shape{c.n, c.vp}, ++seed, -6.0f, 6.0f);
    const Tensor targets = Targets(c.n, shard.vocab_size, seed);
    Tensor want_max = Make(Shape{c.n}), want_sums = Make(Shape{2, c.n});
    LOOM_ASSERT_OK(VocabShardRowMax(logits, shard, &want_max));
    LOOM_ASSERT_OK(VocabShardSumExp(logits, targets, want_max, shard, &want_sums));
    Tensor max = Make(Shape{c.n}), sums = Make(Shape{2, c.n});
    std::memset(max.raw_data(), 0xff, max.nbytes());
    std::memset(sums.raw_data(), 0xff, sums.nbytes());
    LOOM_ASSERT_OK(VocabShardRowMaxSumExp(logits, targets, shard, &max, &sums));
    EXPECT_TRUE(SameBits(max, want_max)) << c.n << "x" << c.vp;
    EXPECT_TRUE(SameBits(sums, want_sums)) << c.n << "x" << c.vp;
  }
}

// The bound the online forward is held to against the unfused one under TP
// (layers/vocab_parallel_online_test relies on it): per shard, the rescaled
// sum of exponentials is within kRescaleTol (relative) of the sum taken
// against the global max, and the target logits are bitwise equal.
constexpr double kRescaleTol = 4e-6;

// Splits [n, vocab] over `shards` (the last padded with large garbage); the
// TP all-reduces are done here. Compares each shard's rescaled sums with
// VocabShardSumExp against the global max, and the total loss.
void CheckRescaledShards(int64_t n, int64_t vocab, int shards, float spread) {
  const Tensor logits = Random(Shape{n, vocab}, 11, -spread, spread);
  const Tensor targets = Targets(n, vocab, 5);
  const int64_t vp = (vocab + shards - 1) / shards;
  std::vector<Tensor> parts, local_max;
  std::vector<VocabShard> specs;
  Tensor max = Make(Shape{n});
  for (int64_t i = 0; i < n; ++i) max.data<float>()[i] = -INFINITY;
  std::vector<Tensor> sums;
  for (int s = 0; s < shards; ++s) {
    Tensor part = Random(Shape{n, vp}, 100 + s, 50.0f, 60.0f);
    const VocabShard shard{s * vp, std::max<int64_t>(0, std::min(vp, vocab - s * vp)), vocab};
    for (int64_t i = 0; i < n; ++i)
      for (int64_t v = 0; v < shard.valid; ++v)
        part.data<float>()[i * vp + v] = logits.data<float>()[i * vocab + shard.vocab_start + v];
    Tensor lm = Make(Shape{n}), sm = Make(Shape{2, n});
    LOOM_ASSERT_OK(VocabShardRowMaxSumExp(part, targets, shard, &lm, &sm));
    for (int64_t i = 0; i < n; ++i)
      max.data<float>()[i] = std::max(max.data<float>()[i], lm.data<float>()[i]);
    parts.push_back(part);
    specs.push_back(shard);
    local_max.push_back(lm);
    sums.push_back(sm);
  }
  double worst = 0, online_loss = 0, unfused_loss = 0;
  std::vector<double> online(2 * n, 0.0), unfused(2 * n, 0.0);
  for (int s = 0; s < shards; ++s) {
    LOOM_ASSERT_OK(VocabShardRescaleSums(parts[s], targets, local_max[s], max, specs[s], &sums[s]));
    Tensor want = Make(Shape{2, n});
    LOOM_ASSERT_OK(VocabShardSumExp(parts[s], targets, max, specs[s], &want));
    for (int64_t i = 0; i < n; ++i) {
      const float got = sums[s].data<float>()[i], ref = want.data<float>()[i];
      const double rel = ref == 0.0f ? std::abs(got) : std::abs(got - ref) / ref;
      worst = std::max(worst, rel);
      ASSERT_LE(rel, kRescaleTol) << "shard " << s << " row " << i << ": " << got << " vs " << ref;
      ASSERT_EQ(sums[s].data<float>()[n + i], want.data<float>()[n + i]) << "target logit, row " << i;
    }
    for (int64_t k = 0; k < 2 * n; ++k) {
      online[k] += sums[s].data<float>()[k];
      unfused[k] += want.data<float>()[k];
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    online_loss += std::log(online[i]) - online[n + i];
    unfused_loss += std::log(unfused[i]) - unfused[n + i];
  }
  EXPECT_NEAR(online_loss / n, unfused_loss / n, kRescaleTol);
  std::printf("%d shards of %lld x %lld (logits in +-%.0f): worst relative sum gap %.2e\n", shards,
              static_cast<long long>(n), static_cast<long long>(vocab), spread, worst);
}

TEST(VocabParallelCrossEntropyTest, RescaledShardsMatchTheUnfusedSumsWithinTheBound) {
  CheckRescaledShards(9, 50, 1, 4.0f);   // TP 1: nothing to rescale
  CheckRescaledShards(13, 50, 3, 4.0f);  // padding in the last shard
  CheckRescaledShards(16, 50304, 2, 8.0f);
  CheckRescaledShards(16, 50304, 2, 30.0f);  // shards' maxima far apart
  CheckRescaledShards(7, 20, 3, 4.0f);   // Vp 7: the last shard holds 6 columns
  CheckRescaledShards(5, 8, 3, 4.0f);    // Vp 3: the last shard holds 2
}

TEST(VocabParallelCrossEntropyTest, OnlineOpsRefuseBadArguments) {
  const Tensor logits = Random(Shape{2, 4}, 1);
  const Tensor targets = Targets(2, 4, 1);
  Tensor max = Make(Shape{2}), sums = Make(Shape{2, 2});
  EXPECT_TRUE(IsInvalidArgument(VocabShardRowMaxSumExp(logits, targets, {0, 5, 8}, &max, &sums),
                                {"VocabShardRowMaxSumExp", "valid 5", "Vp 4"}));
  Tensor sums3 = Make(Shape{3});
  EXPECT_TRUE(IsInvalidArgument(VocabShardRowMaxSumExp(logits, targets, {0, 4, 4}, &max, &sums3),
                                {"VocabShardRowMaxSumExp", "sums", "expected 4 elements"}));
  Tensor bad_targets = Targets(2, 4, 1);
  bad_targets.data<int32_t>()[1] = 9;
  absl::Status st = VocabShardRowMaxSumExp(logits, bad_targets, {0, 4, 4}, &max, &sums);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("target 9 at token 1"), std::string::npos) << st;
  Tensor max3 = Make(Shape{3});
  EXPECT_TRUE(IsInvalidArgument(VocabShardRescaleSums(logits, targets, max3, max, {0, 4, 4}, &sums),
                                {"VocabShardRescaleSums", "local_max", "expected 2 elements"}));
  EXPECT_TRUE(IsInvalidArgument(VocabShardRescaleSums(logits, targets, max, max, {0, 4, 4}, nullptr),
                                {"VocabShardRescaleSums", "sums"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
