// Hybrid sharding (--num-distributed-optimizer-instances N, Megatron's flag):
// the DP x CP group splits into N instances of consecutive ranks; each
// strategy shards within an instance and the instances hold replicas
// (distributed/gradient_sync.h). Every strategy at N = 2 (DP 4, TP 2 x DP 4,
// PP 2 x DP 4, CP 2 x DP 2, EP 2 x DP 4, ranks as threads) trains the single rank's curve
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

// The replicas' all-reduce of a bucket starts as soon as the instance's
// reduction of it has finished, behind the rest of the backward. With one
// rank an instance (N = DP) that reduction is local, so the count is exact:
// every bucket with --overlap-grad-reduce (ZeRO-1) and under ZeRO-2/3
// (their reduce-scatters run in the backward anyway); none under ZeRO-1
// without overlap (its reductions start after the backward).
TEST(HybridShardTest, ReplicaReductionsStartDuringTheBackward) {
  struct Case {
    Layout layout;
    bool early;
  };
  for (const Case& k : {Case{Optim(Overlapped({1, 1, 4})), true}, Case{Optim({1, 1, 4}), false},
                        Case{OptimGrads({1, 1, 4}), true},
                        Case{OptimGradsParams(Overlapped({1, 1, 4})), true}}) {
    std::mutex mu;
    std::vector<int> early(4, -1);
    size_t buckets = 0;
    testing::RunResult r = testing::Run(
        Hybrid(testing::TinyConfig(k.layout, 2), 4), k.layout, nullptr, [&](int rank, Trainer& t) {
          std::lock_guard<std::mutex> lock(mu);
          early[rank] = t.gradients().replica_reductions_started_early();
          buckets = t.gradients().buckets().size();
        });
    ASSERT_TRUE(r.status.ok()) << Name(k.layout, 4) << ": " << r.status;
    ASSERT_GT(buckets, 1u);
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(early[rank], k.early ? static_cast<int>(buckets) : 0)
          << Name(k.layout, 4) << ", rank " << rank;
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
      EXPECT_EQ(p.gradients, grads);
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

// Expert parallelism: each instance holds whole EP groups, the experts'
// parts are sharded over the instance's share of their expert-data-parallel
// ranks, and the same replicas group averages them. Mixtral-style (4
// experts, top-2, every second layer an MoE) against its single rank.
TrainConfig Moe(const Layout& l, int iters, int instances) {
  TrainConfig c = Hybrid(testing::TinyLlamaConfig(l, iters), instances);
  // DP 8 holds one sample a rank; the router's balance is a micro-batch's,
  // so every layout (the single rank too) runs micro-batches of one.
  c.micro_batch_size = 1;
  c.model.num_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.moe_layer_freq = 2;
  c.model.moe_aux_loss_coeff = 0.01f;
  return c;
}

Layout Ep(int ep, Layout l) {
  l.ep = ep;
  return l;
}

TEST(HybridShardTest, ExpertParallelShardsWithinInstances) {
  const Layout one{1, 1, 1};
  const testing::Curve ref = testing::TrainCurve(Moe(one, kIters, 1), one);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kIters));
  Layout cp2 = OptimGrads(Ep(2, {1, 1, 4}));  // an instance: 2 DP ranks x 2 CP ranks
  cp2.cp = 2;
  const Layout ep2 = Ep(2, Overlapped({1, 1, 4}));
  for (const Layout& l : {Optim(ep2), OptimGrads(ep2), OptimGradsParams(ep2),
                          OptimGradsParams(Ep(2, {1, 1, 8})),  // 2 expert replicas an instance
                          cp2}) {
    testing::ExpectSameCurveAndNorm(testing::TrainCurve(Moe(l, kIters, 2), l), ref, kTolerance,
                                    "MoE " + Name(l, 2));
  }
  // Replicas hold the same experts and the same bits; within an instance
  // the two EP ranks hold different experts. The ledger's parameters and
  // optimizer state are the planner's.
  const Layout l = OptimGradsParams(Ep(2, {1, 1, 4}));
  std::mutex mu;
  std::vector<std::vector<float>> values(4);
  testing::RunResult r = testing::Run(Moe(l, 4, 2), l, nullptr, [&](int rank, Trainer& t) {
    const core::Tensor v = t.gradients().owned_values();
    // The ledger's sharded parts, as the planner predicts them.
    const plan::MemoryBreakdown p = plan::PredictMemory(t.config())[0].bytes;
    const core::MemoryStats s = t.RankMemory();
    EXPECT_EQ(p.parameters, s.peak_of(core::MemoryCategory::kParameters)) << rank;
    EXPECT_EQ(p.optimizer, s.peak_of(core::MemoryCategory::kOptimizer)) << rank;
    std::lock_guard<std::mutex> lock(mu);
    values[rank].assign(v.data<float>(), v.data<float>() + v.numel());
  });
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(values[rank], values[rank + 2]) << "replicas " << rank << ", " << rank + 2;
    EXPECT_NE(values[rank], values[1 - rank]);
  }
  // A checkpoint saved under EP x ZeRO-3 with N = 2 holds every expert
  // once: it continues on one rank, at N = 1 under ZeRO-1, and back at N = 2.
  const std::string saved = Dir("moe_n2"), again = Dir("moe_n1");
  TrainConfig c = Moe(l, kCheckpointIters, 2);
  c.save = saved;
  c.save_interval = 10;
  testing::RunResult whole = testing::Run(c, l);
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  struct Resume {
    Layout layout;
    int instances;
    std::string from, to;
    int at;
  };
  for (const Resume& k : {Resume{one, 1, saved, "", 10},
                          Resume{Optim(Ep(2, {1, 1, 4})), 1, saved, again, 10},
                          Resume{OptimGrads(Ep(2, {1, 1, 4})), 2, again, "", 20}}) {
    TrainConfig resumed = Moe(k.layout, kCheckpointIters, k.instances);
    resumed.load = k.from;
    resumed.save = k.to;
    if (!k.to.empty()) resumed.save_interval = 10;
    resumed.checkpoint.load_iteration = k.at;
    testing::RunResult got = testing::Run(resumed, k.layout);
    ASSERT_TRUE(got.status.ok()) << Name(k.layout, k.instances) << ": " << got.status;
    testing::ExpectSameCurve(
        got.losses, whole.losses, k.at, kCheckpointTolerance,
        absl::StrCat("MoE ", Name(k.layout, k.instances), " resumed at ", k.at));
  }
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
  // Expert parallelism: an instance of one DP rank cannot hold an EP group of 2.
  c = Moe(OptimGrads(Ep(2, {1, 1, 4})), 2, 4);
  m = error(c, 4);
  EXPECT_NE(m.find("--num-distributed-optimizer-instances (4): the data-parallel ranks of an "
                   "instance (DP 4 / 4 = 1) must be a multiple of --expert-model-parallel-size "
                   "(2)"),
            std::string::npos)
      << m;
  c = Moe(OptimGrads(Ep(2, {1, 1, 4})), 2, 2);
  const absl::Status accepted = Finalize(&c, 4);
  EXPECT_TRUE(accepted.ok()) << accepted;
  // Accepted: N = DP.
  c = testing::TinyConfig(Optim({1, 1, 4}), 2);
  c.num_distributed_optimizer_instances = 4;
  EXPECT_TRUE(Finalize(&c, 4).ok());
}

}  // namespace
}  // namespace loom::train
