// Hybrid sharding (--num-distributed-optimizer-instances N, Megatron's flag):
// the DP x CP group splits into N instances of consecutive ranks; each
// strategy shards within an instance and the instances hold replicas
// (distributed/gradient_sync.h). Every strategy at N = 2 (DP 4, TP 2 x DP 4,
// PP 2 x DP 4, CP 2 x DP 2, ranks as threads) trains the single rank's curve
// and ends with its gradient norm (1e-6, the ZeRO tests' tolerance); the
// replicas stay identical bit for bit; checkpoints cross N, strategies and
// layouts (1e-5); the ledger's sharded parts are ÷ (DP / N), as the planner
// predicts; bad combinations are refused before any work, naming the flags.

#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "checkpoint/format.h"
#include "core/memory_stats.h"
#include "gtest/gtest.h"
#include "plan/memory_model.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;
using testing::OptimGrads;
using testing::OptimGradsParams;

constexpr double kTolerance = 1e-6;
constexpr int kIters = 10;

Layout Optim(Layout l) {
  l.distributed = true;
  return l;
}

TrainConfig Hybrid(TrainConfig c, int instances) {
  c.num_distributed_optimizer_instances = instances;
  return c;
}

std::string Name(const Layout& l, int instances) {
  return absl::StrCat(l.Describe(), " N=", instances);
}

// Both overlaps.
Layout Overlapped(Layout l) {
  l.overlap = true;
  l.param_gather = true;
  return l;
}

TEST(HybridShardTest, EveryStrategyGivesTheSingleRankCurveAndNorm) {
  const Layout one{1, 1, 1};
  const testing::Curve ref = testing::TrainCurve(testing::TinyConfig(one, kIters), one);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
  ASSERT_GT(ref.grad_norm, 0);
  struct Case {
    Layout layout;
    int instances;
  };
  std::vector<Case> cases;
  for (Layout (*strategy)(Layout) : {Optim, OptimGrads, OptimGradsParams}) {
    cases.push_back({strategy(Overlapped({1, 1, 4})), 2});
    cases.push_back({strategy(Overlapped({2, 1, 4, 0, /*sp=*/true})), 2});  // 8 ranks
    cases.push_back({strategy({1, 2, 4}), 2});                             // 8 ranks
  }
  cases.push_back({Optim({1, 1, 4}), 2});           // no overlap
  cases.push_back({OptimGrads({1, 1, 4}), 4});      // one rank an instance: nothing sharded
  cases.push_back({OptimGradsParams({1, 1, 4}), 4});
  // CP 2 x DP 2: an instance is one DP rank with both its CP ranks.
  cases.push_back({OptimGradsParams(Overlapped({1, 1, 2, 0, false, false, "1f1b", false, false,
                                                /*cp=*/2})),
                   2});
  for (const Case& k : cases) {
    const testing::Curve got = testing::TrainCurve(
        Hybrid(testing::TinyConfig(k.layout, kIters), k.instances), k.layout);
    testing::ExpectSameCurveAndNorm(got, ref, kTolerance, Name(k.layout, k.instances));
  }
  // Recomputation gathers the units again, within the instance.
  const Layout l = OptimGradsParams(Overlapped({1, 1, 4}));
  TrainConfig c = Hybrid(testing::TinyConfig(l, kIters), 2);
  c.model.recompute_granularity = layers::RecomputeGranularity::kFull;
  c.model.recompute_method = layers::RecomputeMethod::kUniform;
  c.model.recompute_num_layers = 1;
  testing::ExpectSameCurveAndNorm(testing::TrainCurve(c, l), ref, kTolerance,
                                  Name(l, 2) + " recompute full");
  // Llama-style (untied output layer, RMSNorm, RoPE, SwiGLU, GQA).
  const testing::Curve llama_ref =
      testing::TrainCurve(testing::TinyLlamaConfig(one, kIters), one);
  for (const Layout& ll : {OptimGradsParams(Overlapped({1, 1, 4})), OptimGrads({1, 2, 4})}) {
    testing::ExpectSameCurveAndNorm(
        testing::TrainCurve(Hybrid(testing::TinyLlamaConfig(ll, kIters), 2), ll), llama_ref,
        kTolerance, "Llama-style " + Name(ll, 2));
  }
}

// Which ranks form an instance (consecutive DP ranks) and which hold
// replicas; after training, rank r of every instance holds the same owned
// moments (and under ZeRO-3 the same owned values) bit for bit.
TEST(HybridShardTest, InstancesAreConsecutiveRanksAndReplicasStayIdentical) {
  for (const Layout& l : {Optim({1, 1, 4}), OptimGradsParams(Overlapped({1, 1, 4}))}) {
    for (const int n : {1, 2}) {
      std::mutex mu;
      std::vector<std::vector<float>> moments(4), values(4);
      testing::RunResult r = testing::Run(
          Hybrid(testing::TinyConfig(l, 4), n), l, nullptr, [&](int rank, Trainer& t) {
            const distributed::GradientSync& g = t.gradients();
            EXPECT_EQ(g.instance(), rank / (4 / n)) << Name(l, n);
            ASSERT_NE(g.shard_group(), nullptr);
            EXPECT_EQ(g.shard_group()->size(), 4 / n) << Name(l, n);
            EXPECT_EQ(g.shard_group()->rank(), rank % (4 / n)) << Name(l, n);
            if (n == 1) {
              EXPECT_EQ(g.replicas(), nullptr);
            } else {
              ASSERT_NE(g.replicas(), nullptr);
              EXPECT_EQ(g.replicas()->size(), n);
              EXPECT_EQ(g.replicas()->rank(), g.instance());
            }
            const core::Tensor& m = t.optimizer().exp_avg();
            std::vector<float> mine(m.data<float>(), m.data<float>() + m.numel());
            std::vector<float> vals;
            if (l.shard_params) {
              const core::Tensor v = g.owned_values();
              vals.assign(v.data<float>(), v.data<float>() + v.numel());
            }
            std::lock_guard<std::mutex> lock(mu);
            moments[rank] = std::move(mine);
            values[rank] = std::move(vals);
          });
      ASSERT_TRUE(r.status.ok()) << Name(l, n) << ": " << r.status;
      if (n == 1) continue;
      for (int rank = 0; rank < 2; ++rank) {
        ASSERT_EQ(moments[rank].size(), moments[rank + 2].size());
        EXPECT_EQ(std::memcmp(moments[rank].data(), moments[rank + 2].data(),
                              moments[rank].size() * sizeof(float)),
                  0)
            << Name(l, n) << ": ranks " << rank << " and " << rank + 2 << " differ";
        EXPECT_EQ(values[rank], values[rank + 2]) << Name(l, n) << ", rank " << rank;
        EXPECT_NE(moments[rank], moments[1 - rank]) << "two shards of one instance";
      }
    }
  }
}

// The ledger: what the strategy shards is ÷ (DP / N) per rank (N = 2 at DP 4
// holds twice N = 1's shard), exactly as the planner predicts.
TEST(HybridShardTest, LedgerShardsOverTheInstance) {
  using core::MemoryCategory;
  for (const Layout& l : {Optim({1, 1, 4}), OptimGrads({1, 1, 4}), OptimGradsParams({1, 1, 4})}) {
    std::vector<core::MemoryStats> stats[3];
    std::vector<int64_t> padded[3], owned[3];
    TrainConfig finalized[3];
    for (const int n : {1, 2}) {
      std::mutex mu;
      stats[n].resize(4);
      padded[n].resize(4);
      owned[n].resize(4);
      testing::RunResult r = testing::Run(
          Hybrid(testing::TinyConfig(l, 2), n), l, nullptr, [&](int rank, Trainer& t) {
            std::lock_guard<std::mutex> lock(mu);
            stats[n][rank] = t.RankMemory();
            padded[n][rank] = t.model().params().padded_numel();
            for (const auto& [b, e] : t.optimizer().owned()) owned[n][rank] += e - b;
            if (rank == 0) finalized[n] = t.config();
          });
      ASSERT_TRUE(r.status.ok()) << Name(l, n) << ": " << r.status;
    }
    const plan::MemoryBreakdown p = plan::PredictMemory(finalized[2])[0].bytes;
    const plan::MemoryBreakdown p1 = plan::PredictMemory(finalized[1])[0].bytes;
    for (int rank = 0; rank < 4; ++rank) {
      SCOPED_TRACE(Name(l, 2) + ", rank " + std::to_string(rank));
      const core::MemoryStats& s = stats[2][rank];
      // The same padded buffer (slots padded to DP x CP), sharded over 2 ranks, not 4.
      EXPECT_EQ(padded[2][rank], padded[1][rank]);
      EXPECT_EQ(2 * owned[2][rank], padded[2][rank]);
      EXPECT_EQ(owned[2][rank], 2 * owned[1][rank]);
      // Adam's moments of the owned shard, + the norm's f64 (split over the instance).
      EXPECT_EQ(s.peak_of(MemoryCategory::kOptimizer), 8 * owned[2][rank] + 8);
      if (l.shard_params) {
        EXPECT_EQ(s.peak_of(MemoryCategory::kParameters), 4 * owned[2][rank]);
        EXPECT_EQ(s.peak_of(MemoryCategory::kParameters),
                  2 * stats[1][rank].peak_of(MemoryCategory::kParameters));
      }
      const int64_t grads = s.peak_of(MemoryCategory::kGradients),
                    grads1 = stats[1][rank].peak_of(MemoryCategory::kGradients);
      if (l.shard_grads) {
        // The f32 gradient shard doubles; the bucket buffers stay as they were.
        EXPECT_EQ(grads - grads1, 4 * (owned[2][rank] - owned[1][rank]));
      } else {
        EXPECT_EQ(grads, 4 * padded[2][rank]);
      }
      EXPECT_EQ(p.parameters, s.peak_of(MemoryCategory::kParameters));
      EXPECT_EQ(p.optimizer, s.peak_of(MemoryCategory::kOptimizer));
      EXPECT_EQ(p.gradients - p1.gradients, grads - grads1);
      // (ZeRO-3's bucket pool at PP 1 with one-layer buckets: the planner
      // predicts one embedding bucket less at N = 1 and N = 2 alike.)
      if (!l.shard_params) {
        EXPECT_EQ(p.gradients, grads);
      }
    }
  }
}

// A checkpoint saved with N = 2 holds every tensor once (instance 0 writes
// the sharded state): it loads with N = 1 under any strategy and layout, and
// a checkpoint saved with N = 1 loads with N = 2.
constexpr double kCheckpointTolerance = 1e-5;  // as zero3_test and checkpoint_reshard_test
constexpr int kCheckpointIters = 30;

std::string Dir(const std::string& name) {
  const std::string d = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  EXPECT_TRUE(checkpoint::RemoveTree(d).ok());
  return d;
}

void Continue(const std::vector<double>& ref, const Layout& l, int instances,
              const std::string& load_dir, int from, const std::string& save_dir) {
  TrainConfig c = Hybrid(testing::TinyConfig(l, kCheckpointIters), instances);
  c.load = load_dir;
  c.save = save_dir;
  if (!save_dir.empty()) c.save_interval = 10;
  c.checkpoint.load_iteration = from;
  testing::RunResult r = testing::Run(c, l);
  ASSERT_TRUE(r.status.ok()) << Name(l, instances) << ": " << r.status;
  testing::ExpectSameCurve(r.losses, ref, from, kCheckpointTolerance,
                           absl::StrCat(Name(l, instances), " resumed at ", from));
}

TEST(HybridShardTest, CheckpointsCrossInstancesStrategiesAndLayouts) {
  const Layout a = OptimGradsParams({1, 1, 4});
  const std::string f = Dir("f"), g = Dir("g"), h = Dir("h");
  TrainConfig c = Hybrid(testing::TinyConfig(a, kCheckpointIters), 2);
  c.save = f;
  c.save_interval = 10;
  testing::RunResult ref = testing::Run(c, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kCheckpointIters));
  // Instance 0 (ranks 0, 1) wrote the values and moments; instance 1's
  // shard files (ranks 2, 3) hold none of them.
  auto bytes = [&](int rank) -> uintmax_t {
    std::error_code error;
    const uintmax_t n = std::filesystem::file_size(
        checkpoint::JoinPath(checkpoint::JoinPath(f, checkpoint::IterDirName(10)),
                             checkpoint::ShardFileName(rank, 4)),
        error);
    return error ? 0 : n;
  };
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GT(bytes(rank), 0u) << rank;
    EXPECT_LT(10 * bytes(rank + 2), bytes(rank)) << "rank " << rank + 2 << " wrote its replica";
  }
  // N = 2 -> N = 1: ZeRO-3 DP 2, ZeRO-1 DP 4, no_shard on one rank.
  Continue(ref.losses, OptimGradsParams({1, 1, 2}), 1, f, 10, g);
  Continue(ref.losses, Optim({1, 1, 4}), 1, f, 20, "");
  Continue(ref.losses, Layout{1, 1, 1}, 1, f, 20, "");
  // And back: N = 1's checkpoint (g, iteration 20) -> N = 2, ZeRO-2 at TP 2 + SP x DP 4.
  Continue(ref.losses, OptimGrads({2, 1, 4, 0, /*sp=*/true}), 2, g, 20, h);
}

// Refused before any work, naming the flags.
TEST(HybridShardTest, RefusesBadCombinations) {
  auto error = [](TrainConfig c, int world) {
    absl::Status s = Finalize(&c, world);
    EXPECT_FALSE(s.ok());
    return std::string(s.message());
  };
  TrainConfig c = testing::TinyConfig(Optim({1, 1, 4}), 2);
  c.num_distributed_optimizer_instances = 3;
  std::string m = error(c, 4);
  EXPECT_NE(m.find("--num-distributed-optimizer-instances (3) does not divide the data-parallel "
                   "size (4"),
            std::string::npos)
      << m;
  c.num_distributed_optimizer_instances = 0;
  m = error(c, 4);
  EXPECT_NE(m.find("--num-distributed-optimizer-instances (0) must be >= 1"), std::string::npos)
      << m;
  // TP 2 x DP 2: DP (2) is what N divides, not the world (4).
  c = testing::TinyConfig(Optim({2, 1, 2}), 2);
  c.num_distributed_optimizer_instances = 4;
  m = error(c, 4);
  EXPECT_NE(m.find("data-parallel size (2 = world 4 / (--tensor-model-parallel-size 2"),
            std::string::npos)
      << m;
  // no_shard, typed or by default: nothing to shard within an instance.
  for (const ShardingStrategy typed : {ShardingStrategy::kNoShard, ShardingStrategy::kUnset}) {
    c = testing::TinyConfig(Layout{1, 1, 4}, 2);
    c.data_parallel_sharding_strategy = typed;
    c.num_distributed_optimizer_instances = 2;
    m = error(c, 4);
    EXPECT_NE(m.find("--num-distributed-optimizer-instances=2"), std::string::npos) << m;
    EXPECT_NE(m.find("--data-parallel-sharding-strategy=no_shard"), std::string::npos) << m;
  }
  // Expert parallelism: not yet.
  c = testing::TinyConfig(OptimGrads({1, 1, 4}), 2);
  c.model.num_experts = 2;
  c.model.add_bias_linear = false;
  c.expert_model_parallel_size = 2;
  c.num_distributed_optimizer_instances = 2;
  absl::Status s = Finalize(&c, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("--expert-model-parallel-size=2"), std::string::npos) << s;
  // Accepted: N = DP.
  c = testing::TinyConfig(Optim({1, 1, 4}), 2);
  c.num_distributed_optimizer_instances = 4;
  EXPECT_TRUE(Finalize(&c, 4).ok());
}

}  // namespace
}  // namespace loom::train
