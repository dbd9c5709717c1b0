// The time model under hybrid sharding (--num-distributed-optimizer-instances
// N, #37): the strategy's collectives run within an instance of DP / N ranks,
// and each bucket's shard is all-reduced over the N instances after its
// reduction within the instance: after the backward (exposed), or with
// --overlap-grad-reduce behind it (GradientSync::StartReplicaReductions).
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"

namespace loom::plan {
namespace {

train::TrainConfig Model(int instances) {
  train::TrainConfig c;
  c.model.num_layers = 4;
  c.model.hidden_size = 256;
  c.model.num_attention_heads = 8;
  c.model.seq_length = 128;
  c.model.vocab_size = 512;
  c.micro_batch_size = 1;
  c.global_batch_size = 8;
  c.data_parallel_sharding_strategy = train::ShardingStrategy::kOptim;
  c.num_distributed_optimizer_instances = instances;
  return c;
}

// 64 devices on one node, every collective at 1 GB/s; `peak_flops` sets
// how long the compute takes.
absl::StatusOr<Hardware> OneNode(double peak_flops) {
  return ParseHardware(absl::StrCat(R"(
    name: "one-node" device_memory_bytes: 1e12 memory_bandwidth: 1e15 peak_flops: )",
                                    peak_flops, R"(
    devices_per_node: 64 compute_dtype_bytes: 4
    intra_node { all_reduce { bus_bandwidth: 1e9 } all_gather { bus_bandwidth: 1e9 }
                 reduce_scatter { bus_bandwidth: 1e9 } }
    inter_node { all_reduce { bus_bandwidth: 1e9 } }
  )"),
                       "one-node");
}

// The all-reduce of a rank's half shard (2 ranks an instance) over the 2 replicas.
double ShardAllReduce(const Hardware& hw, const train::TrainConfig& hybrid) {
  const double shard_bytes = 4.0 * static_cast<double>(StageParameters(hybrid, 0)) / 2;
  return CollectiveSeconds(hw, CollectiveKind::kAllReduce, shard_bytes, 2,
                           /*inter_node=*/false, /*ranks_per_node=*/2);
}

TEST(HybridTimeModelTest, ReplicasAllReduceTheShardAfterTheBackward) {
  absl::StatusOr<Hardware> hw = OneNode(1e12);
  ASSERT_TRUE(hw.ok()) << hw.status();
  // DP 4 as 2 instances of 2 against DP 2 alone: the same ZeRO-1 traffic
  // within 2 ranks, plus the all-reduce of the 1/2 shard over 2 instances.
  train::TrainConfig hybrid = Model(2), dp2 = Model(1);
  ASSERT_TRUE(train::Finalize(&hybrid, 4).ok());
  ASSERT_TRUE(train::Finalize(&dp2, 2).ok());
  absl::StatusOr<StepTime> h = PredictStepTime(hybrid, *hw), d = PredictStepTime(dp2, *hw);
  ASSERT_TRUE(h.ok() && d.ok());
  const double all_reduce = ShardAllReduce(*hw, hybrid);
  ASSERT_GT(all_reduce, 0);
  // (The slots are padded to 4 ranks instead of 2: a few elements more.)
  EXPECT_NEAR(h->dp_comm - d->dp_comm, all_reduce, 0.01 * all_reduce);
  EXPECT_NEAR(h->dp_exposed - d->dp_exposed, all_reduce, 0.01 * all_reduce);
  // N = 1 at DP 4 on the same links moves as many bytes per rank (ring
  // reduce-scatter + all-gather over 4: 2 x 3/4 of the gradients; over 2
  // plus the half shard's all-reduce over 2: 1/2 + 1/2 + 1/2): hybrid pays
  // off where the instance's links are faster than those between instances.
  train::TrainConfig flat = Model(1);
  ASSERT_TRUE(train::Finalize(&flat, 4).ok());
  absl::StatusOr<StepTime> f = PredictStepTime(flat, *hw);
  ASSERT_TRUE(f.ok());
  EXPECT_NEAR(f->dp_comm, h->dp_comm, 0.01 * h->dp_comm);
}

// With --overlap-grad-reduce each bucket's replica all-reduce follows its
// reduce-scatter behind the backward: on a machine where the backward
// outlasts the traffic, only the last bucket's stays exposed.
TEST(HybridTimeModelTest, OverlappedReplicaAllReducesHideBehindTheBackward) {
  absl::StatusOr<Hardware> hw = OneNode(2e9);  // slow compute: the backward outlasts the traffic
  ASSERT_TRUE(hw.ok()) << hw.status();
  train::TrainConfig hybrid = Model(2), dp2 = Model(1);
  hybrid.overlap_grad_reduce = dp2.overlap_grad_reduce = true;
  ASSERT_TRUE(train::Finalize(&hybrid, 4).ok());
  ASSERT_TRUE(train::Finalize(&dp2, 2).ok());
  absl::StatusOr<StepTime> h = PredictStepTime(hybrid, *hw), d = PredictStepTime(dp2, *hw);
  ASSERT_TRUE(h.ok() && d.ok());
  const double all_reduce = ShardAllReduce(*hw, hybrid);
  ASSERT_GT(h->compute, 10 * h->dp_comm) << "the backward must outlast the traffic";
  // The same bytes move (one all-reduce a bucket: a latency more per layer) ...
  EXPECT_GE(h->dp_comm - d->dp_comm, all_reduce);
  EXPECT_LT(h->dp_comm - d->dp_comm, 1.5 * all_reduce);
  // ... but at most the last bucket's (the embedding's, the largest here) is exposed.
  EXPECT_LT(h->dp_exposed - d->dp_exposed, 0.5 * all_reduce);
  EXPECT_GT(h->dp_exposed, d->dp_exposed);
}

// Why the planner searches it: across two nodes whose link is slow, DP 4 as
// one instance a node moves its reduce-scatters and gathers over the fast
// links and only the half shard's all-reduce over the slow one.
TEST(HybridTimeModelTest, OneInstanceANodeMovesLessOverTheSlowLink) {
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    name: "two-nodes" device_memory_bytes: 1e12 peak_flops: 1e12 memory_bandwidth: 1e15
    devices_per_node: 2 compute_dtype_bytes: 4
    intra_node { all_reduce { bus_bandwidth: 1e11 } all_gather { bus_bandwidth: 1e11 }
                 reduce_scatter { bus_bandwidth: 1e11 } }
    inter_node { all_reduce { bus_bandwidth: 1e8 } all_gather { bus_bandwidth: 1e8 }
                 reduce_scatter { bus_bandwidth: 1e8 } }
  )", "two-nodes");
  ASSERT_TRUE(hw.ok()) << hw.status();
  train::TrainConfig hybrid = Model(2), flat = Model(1);
  ASSERT_TRUE(train::Finalize(&hybrid, 4).ok());
  ASSERT_TRUE(train::Finalize(&flat, 4).ok());
  absl::StatusOr<StepTime> h = PredictStepTime(hybrid, *hw), f = PredictStepTime(flat, *hw);
  ASSERT_TRUE(h.ok() && f.ok());
  // Flat: the reduce-scatter and the gather cross the slow link; hybrid:
  // both stay on the node and only the half shard's all-reduce crosses it.
  const double shard_bytes = 4.0 * static_cast<double>(StageParameters(hybrid, 0)) / 2;
  const double slow = CollectiveSeconds(*hw, CollectiveKind::kAllReduce, shard_bytes, 2,
                                        /*inter_node=*/true, /*ranks_per_node=*/1);
  EXPECT_NEAR(h->dp_comm, slow, 0.05 * slow);
  EXPECT_LT(h->dp_comm, 0.75 * f->dp_comm) << h->dp_comm << " vs " << f->dp_comm;
  EXPECT_LT(h->step, f->step);
}

}  // namespace
}  // namespace loom::plan
