#include "plan/auto_layout.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plan/memory_model.h"
#include "plan/report.h"

namespace loom::plan {
namespace {

train::TrainConfig Tiny() {
  train::TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 16;
  c.global_batch_size = 8;
  return c;
}

Hardware Cpu() {
  std::string what;
  absl::StatusOr<Hardware> hw = AutoLayoutHardware("", "cpu", &what);
  EXPECT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(what, "built-in plan/testdata/cpu.textproto");
  return *hw;
}

TEST(AutoLayout, BuiltinHardwareParses) {
  std::string what;
  absl::StatusOr<Hardware> cuda = AutoLayoutHardware("", "cuda", &what);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->devices_per_node(), 8);
  EXPECT_TRUE(Cpu().ranks_share_compute());
}

TEST(AutoLayout, BadFileIsNamed) {
  std::string what;
  absl::StatusOr<Hardware> hw = AutoLayoutHardware("/nonexistent/hw.textproto", "cpu", &what);
  ASSERT_FALSE(hw.ok());
  EXPECT_TRUE(absl::StrContains(hw.status().message(), "--hardware=/nonexistent/hw.textproto"))
      << hw.status();
}

// The choice is //train:plan's row 1, and the same every time it is computed.
TEST(AutoLayout, FastestThatFitsDeterministic) {
  const Hardware hw = Cpu();
  absl::StatusOr<AutoLayout> a = ChooseLayout(Tiny(), 4, hw, "cpu");
  ASSERT_TRUE(a.ok()) << a.status();
  SearchOptions search;
  search.gpus = 4;
  search.devices_per_node = hw.devices_per_node();
  absl::StatusOr<std::vector<Planned>> plans = PlanAll(Tiny(), hw, search, {});
  ASSERT_TRUE(plans.ok());
  const train::TrainConfig& row1 = plans->front().config;
  EXPECT_EQ(a->config.tensor_model_parallel_size, row1.tensor_model_parallel_size);
  EXPECT_EQ(a->config.pipeline_model_parallel_size, row1.pipeline_model_parallel_size);
  EXPECT_EQ(a->config.micro_batch_size, row1.micro_batch_size);
  EXPECT_EQ(a->config.optimizer.distributed, row1.optimizer.distributed);
  EXPECT_EQ(a->best.time.step, plans->front().time.step);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<AutoLayout> again = ChooseLayout(Tiny(), 4, hw, "cpu");
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->log_line, a->log_line);
    EXPECT_EQ(again->flags, a->flags);
  }
  EXPECT_TRUE(absl::StartsWith(a->log_line, "loom: --auto-layout chose TP ")) << a->log_line;
  EXPECT_TRUE(absl::StrContains(a->log_line, "second best: ")) << a->log_line;
  // Not finalized, every other field kept.
  EXPECT_EQ(a->config.global_batch_size, 8);
  EXPECT_EQ(a->config.model.hidden_size, 32);
  train::TrainConfig done = a->config;
  EXPECT_TRUE(train::Finalize(&done, 4).ok());
}

TEST(AutoLayout, NothingFits) {
  Hardware hw = Cpu();
  hw.set_device_memory_bytes(1024);
  absl::StatusOr<AutoLayout> a = ChooseLayout(Tiny(), 2, hw, "tiny.textproto");
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::StrContains(a.status().message(), "fits in")) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "tiny.textproto")) << a.status();
}

TEST(AutoLayout, TypedLayoutFlagsAreConstraints) {
  const std::set<std::string> fixed =
      TypedLayoutFlags({"gpt", "seq_length", "auto_layout", "tensor_model_parallel_size",
                        "nouse_distributed_optimizer"});
  EXPECT_EQ(fixed,
            (std::set<std::string>{"tensor_model_parallel_size", "use_distributed_optimizer"}));
  train::TrainConfig c = Tiny();
  c.tensor_model_parallel_size = 2;
  EXPECT_EQ(FixedFlags(c, fixed), "--tensor-model-parallel-size=2 --nouse-distributed-optimizer");
}

TEST(AutoLayout, TypedTensorParallelSizeIsKept) {
  absl::StatusOr<AutoLayout> free = ChooseLayout(Tiny(), 4, Cpu(), "cpu");
  ASSERT_TRUE(free.ok()) << free.status();
  // A TP the unconstrained choice did not take, so the constraint matters.
  const int want = free->config.tensor_model_parallel_size == 1 ? 2 : 1;
  train::TrainConfig c = Tiny();
  c.tensor_model_parallel_size = want;
  absl::StatusOr<AutoLayout> a = ChooseLayout(c, 4, Cpu(), "cpu", {"tensor_model_parallel_size"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->config.tensor_model_parallel_size, want);
  ASSERT_FALSE(a->runners_up.empty());
  EXPECT_EQ(a->runners_up[0].config.tensor_model_parallel_size, want);
  EXPECT_TRUE(absl::StartsWith(
      a->log_line, absl::StrCat("loom: --auto-layout chose TP ", want, " (typed) x PP ")))
      << a->log_line;
  EXPECT_LT(a->candidates, free->candidates);
}

TEST(AutoLayout, TypedDistributedOptimizerOnAndOff) {
  for (bool on : {true, false}) {
    train::TrainConfig c = Tiny();
    c.optimizer.distributed = on;
    absl::StatusOr<AutoLayout> a = ChooseLayout(c, 2, Cpu(), "cpu", {"use_distributed_optimizer"});
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->config.optimizer.distributed, on);
    EXPECT_TRUE(absl::StrContains(a->log_line, on ? ", ZeRO-1 (typed)" : ", no ZeRO-1 (typed)"))
        << a->log_line;
  }
}

// --recompute-method=block alone: the planner fills in full granularity.
TEST(AutoLayout, TypedRecomputeFieldReplacesItsOwn) {
  train::TrainConfig c = Tiny();
  c.model.recompute_method = layers::RecomputeMethod::kBlock;
  absl::StatusOr<AutoLayout> a = ChooseLayout(c, 2, Cpu(), "cpu", {"recompute_method"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->config.model.recompute_granularity, layers::RecomputeGranularity::kFull);
  EXPECT_EQ(a->config.model.recompute_method, layers::RecomputeMethod::kBlock);
  EXPECT_TRUE(absl::StrContains(a->log_line, ", recompute full (typed)")) << a->log_line;
}

TEST(AutoLayout, ImpossibleConstraintIsNamed) {
  train::TrainConfig c = Tiny();
  c.tensor_model_parallel_size = 3;
  absl::StatusOr<AutoLayout> a = ChooseLayout(c, 4, Cpu(), "cpu", {"tensor_model_parallel_size"});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(a.status().message(),
                               "--auto-layout --tensor-model-parallel-size=3: no layout of this "
                               "model with these values is valid on 4 ranks"))
      << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "TP 3 ")) << a.status();  // the refusal
}

// ZeRO-2 in the memory model: at DP 4 the gradients fall to a quarter plus
// the bucket buffers bound at once (the embedding's bucket, which the head
// starts at PP 1 through the tied table, and a layer's), the moments as
// ZeRO-1's; and the search offers it.
TEST(AutoLayout, OptimGradsShardsTheGradientsAndIsSearched) {
  train::TrainConfig base = Tiny();
  base.model.num_layers = 8;
  base.model.hidden_size = 256;
  base.model.vocab_size = 1000;
  base.optimizer.bucket_bytes = 1 << 20;
  base.micro_batch_size = 2;  // x DP 4 = the global batch of 8
  std::vector<MemoryBreakdown> bytes;
  using S = train::ShardingStrategy;
  for (const S strategy : {S::kNoShard, S::kOptim, S::kOptimGrads}) {
    train::TrainConfig c = base;
    c.data_parallel_sharding_strategy = strategy;
    ASSERT_TRUE(train::Finalize(&c, 4).ok()) << core::EnumName(strategy);
    bytes.push_back(PeakMemory(PredictMemory(c)).bytes);
  }
  const double no_shard = bytes[0].gradients;
  EXPECT_EQ(bytes[1].gradients, no_shard);
  EXPECT_EQ(bytes[2].optimizer, bytes[1].optimizer);
  EXPECT_LT(bytes[1].optimizer, bytes[0].optimizer);
  // The embedding's bucket: 1024 padded vocabulary rows (TP 1 x 128) and 16
  // positions of 256; a layer (12h² + 13h = 789,760 parameters, 3.2 MB) is
  // bigger than --ddp-bucket-size, so a bucket of its own.
  const double embedding = (1024 + 16) * 256, layer = 12 * 256 * 256 + 13 * 256;
  EXPECT_EQ(bytes[2].gradients, no_shard / 4 + 4 * (embedding + layer));
  SearchOptions search;
  search.gpus = 4;
  int zero2 = 0;
  for (const train::TrainConfig& c : EnumerateLayouts(base, search)) {
    if (c.optimizer.shard_gradients) {
      ++zero2;
      EXPECT_TRUE(c.optimizer.distributed);
      EXPECT_TRUE(absl::StrContains(LayoutFlags(c), "--data-parallel-sharding-strategy=optim_grads"));
    }
  }
  EXPECT_GT(zero2, 0);
  // Typed, it is kept, and the ranks are told.
  train::TrainConfig typed = base;
  typed.data_parallel_sharding_strategy = train::ShardingStrategy::kOptimGrads;
  absl::StatusOr<AutoLayout> a =
      ChooseLayout(typed, 4, Cpu(), "cpu", {"data_parallel_sharding_strategy"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->config.optimizer.shard_gradients);
  EXPECT_TRUE(absl::StrContains(a->log_line, ", ZeRO-2 (typed)")) << a->log_line;
  EXPECT_NE(std::find(a->flags.begin(), a->flags.end(),
                      "--data_parallel_sharding_strategy=optim_grads"),
            a->flags.end());
}

// ZeRO-3 is searched (where Finalize lets it run), its flags name it, and a
// typed optim_grads_params is kept and reported.
TEST(AutoLayout, OptimGradsParamsIsSearchedAndKept) {
  train::TrainConfig base = Tiny();
  base.model.num_layers = 8;
  base.micro_batch_size = 2;
  SearchOptions search;
  search.gpus = 4;
  int zero3 = 0;
  for (const train::TrainConfig& c : EnumerateLayouts(base, search)) {
    if (!c.optimizer.shard_params) continue;
    ++zero3;
    EXPECT_TRUE(c.optimizer.distributed && c.optimizer.shard_gradients);
    EXPECT_TRUE(absl::StrContains(LayoutFlags(c),
                                  "--data-parallel-sharding-strategy=optim_grads_params"));
    EXPECT_TRUE(absl::StrContains(DescribeLayout(c), " optim_grads_params"));
  }
  EXPECT_GT(zero3, 0);
  train::TrainConfig typed = base;
  typed.data_parallel_sharding_strategy = train::ShardingStrategy::kOptimGradsParams;
  absl::StatusOr<AutoLayout> a =
      ChooseLayout(typed, 4, Cpu(), "cpu", {"data_parallel_sharding_strategy"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->config.optimizer.shard_params);
  EXPECT_TRUE(absl::StrContains(a->log_line, ", ZeRO-3 (typed)")) << a->log_line;
  EXPECT_NE(std::find(a->flags.begin(), a->flags.end(),
                      "--data_parallel_sharding_strategy=optim_grads_params"),
            a->flags.end());
}

// Hybrid sharding (--num-distributed-optimizer-instances) is searched where
// the gradient group spans nodes: one instance a node, for every strategy
// but no_shard; a typed N is kept and passed on.
TEST(AutoLayout, HybridShardingIsSearchedAcrossNodesAndKept) {
  train::TrainConfig base = Tiny();
  base.model.num_layers = 8;
  base.micro_batch_size = 2;
  SearchOptions search;
  search.gpus = 4;
  search.devices_per_node = 2;  // two nodes
  int hybrid = 0;
  for (const train::TrainConfig& c : EnumerateLayouts(base, search)) {
    const int n = c.num_distributed_optimizer_instances;
    if (n == 1) continue;
    ++hybrid;
    EXPECT_TRUE(c.optimizer.distributed) << DescribeLayout(c);
    // A node holds 2 / TP of the gradient group: one instance each.
    EXPECT_EQ(n, c.data_parallel_size * c.context_parallel_size /
                     (2 / c.tensor_model_parallel_size))
        << DescribeLayout(c);
    EXPECT_TRUE(absl::StrContains(LayoutFlags(c), "--num-distributed-optimizer-instances=2"));
    EXPECT_TRUE(absl::StrContains(DescribeLayout(c), " x2 instances"));
  }
  EXPECT_GT(hybrid, 0);
  search.devices_per_node = 4;  // one node: nothing to replicate across
  for (const train::TrainConfig& c : EnumerateLayouts(base, search)) {
    EXPECT_EQ(c.num_distributed_optimizer_instances, 1) << DescribeLayout(c);
  }
  train::TrainConfig typed = base;
  typed.num_distributed_optimizer_instances = 2;
  typed.data_parallel_sharding_strategy = train::ShardingStrategy::kOptimGradsParams;
  absl::StatusOr<AutoLayout> a =
      ChooseLayout(typed, 4, Cpu(), "cpu",
                   {"num_distributed_optimizer_instances", "data_parallel_sharding_strategy"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->config.num_distributed_optimizer_instances, 2);
  EXPECT_TRUE(absl::StrContains(a->log_line, " in 2 instances (typed)")) << a->log_line;
  EXPECT_NE(std::find(a->flags.begin(), a->flags.end(),
                      "--num_distributed_optimizer_instances=2"),
            a->flags.end());
}

}  // namespace
}  // namespace loom::plan
