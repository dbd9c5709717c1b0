// The memory model's replay of GradientSync (bucket pool, ZeRO-3 gathers)
// without training: PredictMemory replays min(M, 4 P) micro-batches, which
// must give the whole step's peaks; and the peaks move the way the schedules
// make them. (Against Loom's own ledger: //tests:plan_memory_model_test.)
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plan/memory_model.h"

namespace loom::plan {
namespace {

using pipeline::ScheduleKind;
using train::ShardingStrategy;

struct Case {
  ScheduleKind schedule;
  int pp;
  int64_t micro_batches;
  ShardingStrategy sharding;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  int64_t bucket_bytes = 16 << 10;  // a bucket a layer
  bool tied = true;
  bool recompute = false;  // full, uniform, 2 layers a run
};

// An 8-layer GPT on PP x DP 2; false when Finalize refuses the combination.
bool Build(const Case& s, train::TrainConfig* out) {
  train::TrainConfig c;
  c.model.num_layers = 8;
  c.model.hidden_size = 64;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 32;
  c.model.max_position_embeddings = 32;
  c.model.vocab_size = 256;
  c.model.untie_embeddings_and_output_weights = !s.tied;
  if (s.recompute) {
    c.model.recompute_granularity = layers::RecomputeGranularity::kFull;
    c.model.recompute_method = layers::RecomputeMethod::kUniform;
    c.model.recompute_num_layers = 2;
  }
  c.pipeline_model_parallel_size = s.pp;
  c.pipeline_schedule = s.schedule;
  if (s.schedule == ScheduleKind::kInterleaved) c.num_layers_per_virtual_pipeline_stage = 2;
  c.data_parallel_sharding_strategy = s.sharding;
  c.overlap_grad_reduce = s.overlap_grad_reduce;
  c.overlap_param_gather = s.overlap_param_gather;
  c.optimizer.bucket_bytes = s.bucket_bytes;
  c.micro_batch_size = 1;
  c.global_batch_size = 2 * s.micro_batches;
  if (!train::Finalize(&c, 2 * s.pp).ok()) return false;
  *out = c;
  return true;
}

std::string Name(const Case& s) {
  return absl::StrCat(pipeline::ScheduleKindName(s.schedule), " PP ", s.pp, " M ",
                      s.micro_batches, " ", core::EnumName(s.sharding),
                      s.overlap_grad_reduce ? " overlap" : "",
                      s.overlap_param_gather ? " param-gather" : "", " bucket ", s.bucket_bytes,
                      s.tied ? " tied" : " untied", s.recompute ? " rc full" : "");
}

TEST(MemoryModelReplayTest, FourMicroBatchesPerStageGiveTheWholeStepsPeaks) {
  int compared = 0;
  for (ScheduleKind schedule : {ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                                ScheduleKind::kZBH1, ScheduleKind::kZBV,
                                ScheduleKind::kDualPipeV}) {
    for (int pp : {2, 4}) {
      for (ShardingStrategy sharding :
           {ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams}) {
        for (int variant = 0; variant < 6; ++variant) {
          Case s{schedule, pp, 10 * pp, sharding};
          s.overlap_grad_reduce = variant == 1 || variant == 5;
          s.overlap_param_gather = variant == 2 || variant == 5;
          s.bucket_bytes = variant == 3 ? 1 << 20 : 16 << 10;
          s.tied = variant != 4;
          s.recompute = variant == 5;
          train::TrainConfig c;
          if (!Build(s, &c)) continue;
          ASSERT_EQ(ReplayedMicroBatches(c), 4 * pp);
          for (int r = 0; r < pp; ++r) {
            const ReplayPeaks whole = ReplayStep(c, r, static_cast<int>(c.num_micro_batches));
            const ReplayPeaks cut = ReplayStep(c, r, ReplayedMicroBatches(c));
            EXPECT_EQ(whole.bucket_pool_bytes, cut.bucket_pool_bytes) << Name(s) << " stage " << r;
            EXPECT_EQ(whole.gathered_bytes, cut.gathered_bytes) << Name(s) << " stage " << r;
            EXPECT_GT(whole.bucket_pool_bytes, 0) << Name(s);
            EXPECT_EQ(whole.gathered_bytes > 0, sharding == ShardingStrategy::kOptimGradsParams);
            ++compared;
          }
        }
      }
    }
  }
  std::printf("%d stages compared\n", compared);
  EXPECT_GE(compared, 200);
}

// A split backward holds a bucket from I to W: on the last stage of zb-h1
// the pool and ZeRO-3's gathers hold more than 1F1B's, which binds one
// unit's buckets at a time.
TEST(MemoryModelReplayTest, SplitBackwardHoldsMoreBucketsThanOneFOneB) {
  for (ShardingStrategy sharding :
       {ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams}) {
    train::TrainConfig one_f_one_b, zb;
    ASSERT_TRUE(Build({ScheduleKind::k1F1B, 2, 8, sharding}, &one_f_one_b));
    ASSERT_TRUE(Build({ScheduleKind::kZBH1, 2, 8, sharding}, &zb));
    const ReplayPeaks a = ReplayStep(one_f_one_b, 1, 8), b = ReplayStep(zb, 1, 8);
    EXPECT_GT(b.bucket_pool_bytes, a.bucket_pool_bytes) << core::EnumName(sharding);
    if (sharding == ShardingStrategy::kOptimGradsParams) {
      EXPECT_GT(b.gathered_bytes, a.gathered_bytes);
    }
    // Even one micro-batch binds every bucket of the stage at once: its I
    // opens all the chunk's units before its W closes any.
    EXPECT_EQ(ReplayStep(zb, 1, 1).bucket_pool_bytes, 4 * StageParameters(zb, 1));
    EXPECT_LT(ReplayStep(one_f_one_b, 1, 1).bucket_pool_bytes, 4 * StageParameters(zb, 1));
  }
}

// ZeRO-3 at PP 1 with a bucket a unit and the tied table: the head's
// backward binds the table's bucket beside its own, so the pool keeps two
// buffers, and the layers' buckets then take the smaller one: the peak is
// a layer's bucket plus the embedding's (the ledger's; the buffers bound at
// any one time never exceed the larger of the two).
TEST(MemoryModelReplayTest, TiedTableAtPipelineOneKeepsTheEmbeddingBuffer) {
  train::TrainConfig c;
  ASSERT_TRUE(Build({ScheduleKind::k1F1B, 1, 4, ShardingStrategy::kOptimGradsParams}, &c));
  train::TrainConfig untied;
  ASSERT_TRUE(Build({ScheduleKind::k1F1B, 1, 4, ShardingStrategy::kOptimGradsParams, false,
                     false, 16 << 10, /*tied=*/false},
                    &untied));
  // The stage's padded elements: the embedding (word + position), 8 equal
  // layers, the final norm (and the untied output layer).
  const int64_t vocab = c.model.vocab_size, h = c.model.hidden_size;
  const int64_t embedding = (vocab + c.model.seq_length) * h;
  const int64_t norm = 2 * h;
  const int64_t layer = (StageParameters(c, 0) - embedding - norm) / 8;
  ASSERT_EQ(StageParameters(c, 0), embedding + 8 * layer + norm);
  ASSERT_GT(layer, embedding);
  EXPECT_EQ(ReplayStep(c, 0, 4).bucket_pool_bytes, 4 * (layer + embedding));
  // Untied, the head's bucket (norm + output layer, smaller than a layer)
  // is bound alone: one buffer, a layer's.
  ASSERT_GT(layer, norm + vocab * h);
  EXPECT_EQ(ReplayStep(untied, 0, 4).bucket_pool_bytes, 4 * layer);
}

}  // namespace
}  // namespace loom::plan
