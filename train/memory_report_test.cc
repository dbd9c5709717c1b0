// Memory as a number (core/memory_stats.h through the trainer): each rank's
// per-category bytes match the arithmetic of its layout — parameters and
// gradients 4 B per element of its flat buffer, Adam 8 B per owned element
// (ZeRO-1: divided by DP), activations freed after the step and smaller with
// TP and SP — and the log line, --metrics-file and --memory-report carry them.

#include <algorithm>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/memory_stats.h"
#include "core/ops/testing/fake_device.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using core::MemoryCategory;
using testing::Layout;

// One rank's figures after Train(), and the arithmetic they should match.
struct RankMemory {
  core::MemoryStats stats;
  int64_t padded_numel = 0;  // the flat parameter (and gradient) buffer
  int64_t owned_numel = 0;   // what the optimizer updates
};

struct Result {
  testing::RunResult run;
  std::vector<RankMemory> ranks;
};

// `also`: called too, with every rank's Trainer after Train().
Result Train(TrainConfig config, const Layout& l, testing::TrainerHook also = nullptr) {
  Result result;
  result.ranks.resize(l.world());
  std::mutex mu;
  result.run = testing::Run(config, l, nullptr, [&](int rank, Trainer& t) {
    if (also) also(rank, t);
    RankMemory m;
    m.stats = t.RankMemory();
    m.padded_numel = t.model().params().padded_numel();
    for (const auto& [begin, end] : t.optimizer().owned()) m.owned_numel += end - begin;
    std::lock_guard<std::mutex> lock(mu);
    result.ranks[rank] = m;
  });
  EXPECT_TRUE(result.run.status.ok()) << l.Describe() << ": " << result.run.status;
  return result;
}

int64_t Current(const RankMemory& m, MemoryCategory c) { return m.stats.current_of(c); }
int64_t Peak(const RankMemory& m, MemoryCategory c) { return m.stats.peak_of(c); }

void ExpectArithmetic(const Result& r, const Layout& l) {
  for (size_t rank = 0; rank < r.ranks.size(); ++rank) {
    const RankMemory& m = r.ranks[rank];
    SCOPED_TRACE(l.Describe() + ", rank " + std::to_string(rank));
    ASSERT_GT(m.padded_numel, 0);
    EXPECT_EQ(Current(m, MemoryCategory::kParameters), 4 * m.padded_numel);
    EXPECT_EQ(Current(m, MemoryCategory::kGradients), 4 * m.padded_numel);
    EXPECT_EQ(Current(m, MemoryCategory::kOptimizer), 2 * 4 * m.owned_numel);
    // The step's activations are gone after it; their peak stays.
    EXPECT_GT(Peak(m, MemoryCategory::kActivations), 0);
    EXPECT_LT(Current(m, MemoryCategory::kActivations), Peak(m, MemoryCategory::kActivations) / 10);
    EXPECT_GE(m.stats.total_peak, Current(m, MemoryCategory::kParameters) +
                                      Current(m, MemoryCategory::kGradients) +
                                      Current(m, MemoryCategory::kOptimizer) +
                                      Peak(m, MemoryCategory::kActivations));
  }
}

TEST(MemoryReportTest, OneRankMatchesTheArithmetic) {
  const Layout one{1, 1, 1};
  Result r = Train(testing::TinyConfig(one, 2), one);
  ExpectArithmetic(r, one);
  EXPECT_EQ(r.ranks[0].owned_numel, r.ranks[0].padded_numel);
}

// Ranks that are threads of one process each see their own bytes: two DP
// ranks hold a full replica each (not two between them).
TEST(MemoryReportTest, PerRankNotPerProcess) {
  const Layout dp2{1, 1, 2};
  Result r = Train(testing::TinyConfig(dp2, 2), dp2);
  ExpectArithmetic(r, dp2);
  for (const RankMemory& m : r.ranks) {
    EXPECT_EQ(m.owned_numel, m.padded_numel);
    // The DP all-reduces staged their chunks in this rank's communicators.
    EXPECT_GT(Peak(m, MemoryCategory::kCommunication), 0);
  }
}

// ZeRO-1: the Adam moments fall by DP; parameters and gradients do not.
TEST(MemoryReportTest, DistributedOptimizerShardsTheMomentsOverDp) {
  const Layout plain{1, 1, 2};
  const Layout zero1{1, 1, 2, 0, false, /*distributed=*/true};
  Result a = Train(testing::TinyConfig(plain, 2), plain);
  Result b = Train(testing::TinyConfig(zero1, 2), zero1);
  ExpectArithmetic(b, zero1);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(2 * b.ranks[rank].owned_numel, b.ranks[rank].padded_numel);
    EXPECT_EQ(2 * Current(b.ranks[rank], MemoryCategory::kOptimizer),
              Current(a.ranks[rank], MemoryCategory::kOptimizer));
    EXPECT_EQ(Current(b.ranks[rank], MemoryCategory::kParameters),
              Current(a.ranks[rank], MemoryCategory::kParameters));
  }
}

// ZeRO-2: gradients fall to the owned shard (1/DP of no_shard's, each
// bucket part split in DP equal slices) plus the pool of bucket buffers.
// The whole buffer never exists during training: the peak is the same
// figure.
TEST(MemoryReportTest, OptimGradsShardsTheGradientsOverDp) {
  for (const int dp : {2, 4}) {
    for (const bool overlap : {false, true}) {
      const Layout plain{1, 1, dp};
      const Layout zero2 = testing::OptimGrads({1, 1, dp, 0, false, false, "1f1b", overlap});
      Result a = Train(testing::TinyConfig(plain, 2), plain);
      std::vector<int64_t> pool_bytes(dp);
      std::mutex mu;
      Result b = Train(testing::TinyConfig(zero2, 2), zero2, [&](int rank, Trainer& t) {
        // Buffers: the word embedding's bucket (GPT-2 at PP 1: the tied
        // output layer writes it, the embedding completes it), and one for
        // the largest other bucket, two with overlap (one reduce-scattering).
        const layers::ParamBuffer& params = t.model().params();
        const int64_t word = params.at(t.model().word_embedding()).offset;
        int64_t word_bucket = 0, other = 0;
        for (const distributed::GradBucket& bucket : t.gradients().buckets()) {
          const int64_t len = bucket.range.second - bucket.range.first;
          if (bucket.range.first <= word && word < bucket.range.second) {
            word_bucket = len;
          } else {
            other = std::max(other, len);
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        pool_bytes[rank] = 4 * (word_bucket + (overlap ? 2 : 1) * other);
      });
      for (int rank = 0; rank < dp; ++rank) {
        SCOPED_TRACE(zero2.Describe() + ", rank " + std::to_string(rank));
        const RankMemory& m = b.ranks[rank];
        EXPECT_EQ(dp * m.owned_numel, m.padded_numel);
        const int64_t no_shard = Current(a.ranks[rank], MemoryCategory::kGradients);
        EXPECT_EQ(no_shard, 4 * m.padded_numel);
        EXPECT_EQ(Current(m, MemoryCategory::kGradients), no_shard / dp + pool_bytes[rank]);
        EXPECT_EQ(Peak(m, MemoryCategory::kGradients), no_shard / dp + pool_bytes[rank]);
        EXPECT_EQ(Current(m, MemoryCategory::kParameters), 4 * m.padded_numel);
        EXPECT_EQ(Current(m, MemoryCategory::kOptimizer), 2 * 4 * m.owned_numel);
      }
    }
  }
}

// ZeRO-3: the parameters fall to the owned f32 shard (1/DP of no_shard's),
// never more, not even at setup; the whole values exist only while a unit
// holds them: the buckets of one unit, with --overlap-param-gather those of
// the neighbour being prefetched too, in the communication category.
TEST(MemoryReportTest, OptimGradsParamsShardsTheParametersOverDp) {
  for (const int dp : {2, 4}) {
    for (const bool prefetch : {false, true}) {
      const Layout plain{1, 1, dp};
      const Layout zero3 =
          testing::OptimGradsParams({1, 1, dp, 0, false, false, "1f1b", prefetch, prefetch});
      Result a = Train(testing::TinyConfig(plain, 2), plain);
      std::vector<int64_t> gathered(dp), expected(dp), held_after(dp);
      std::mutex mu;
      Result b = Train(testing::TinyConfig(zero3, 2), zero3, [&](int rank, Trainer& t) {
        // Units run one after the other (no recomputation): a unit's buckets,
        // with the prefetch those of the next unit in forward order too.
        const distributed::GradientSync& g = t.gradients();
        const std::vector<std::vector<size_t>>& of = g.unit_buckets();
        int64_t most = 0;
        for (size_t u = 0; u < of.size(); ++u) {
          std::vector<size_t> held = of[u];
          if (prefetch && u + 1 < of.size()) held.insert(held.end(), of[u + 1].begin(), of[u + 1].end());
          std::sort(held.begin(), held.end());
          held.erase(std::unique(held.begin(), held.end()), held.end());
          int64_t bytes = 0;
          for (size_t k : held) bytes += 4 * (g.buckets()[k].range.second - g.buckets()[k].range.first);
          most = std::max(most, bytes);
        }
        std::lock_guard<std::mutex> lock(mu);
        gathered[rank] = g.peak_gathered_bytes();
        expected[rank] = most;
        held_after[rank] = g.gathered_bytes();
      });
      for (int rank = 0; rank < dp; ++rank) {
        SCOPED_TRACE(zero3.Describe() + ", rank " + std::to_string(rank));
        const RankMemory& m = b.ranks[rank];
        EXPECT_EQ(dp * m.owned_numel, m.padded_numel);
        const int64_t no_shard = Current(a.ranks[rank], MemoryCategory::kParameters);
        EXPECT_EQ(no_shard, 4 * m.padded_numel);
        EXPECT_EQ(Current(m, MemoryCategory::kParameters), no_shard / dp);
        EXPECT_EQ(Peak(m, MemoryCategory::kParameters), no_shard / dp);
        EXPECT_EQ(Current(m, MemoryCategory::kOptimizer), 2 * 4 * m.owned_numel);
        EXPECT_EQ(gathered[rank], expected[rank]);
        EXPECT_GT(gathered[rank], 0);
        EXPECT_EQ(held_after[rank], 0);
        EXPECT_GE(Peak(m, MemoryCategory::kCommunication), gathered[rank]);
      }
    }
  }
}

// TP splits the attention and MLP activations; SP the rest.
TEST(MemoryReportTest, ActivationsFallWithTpAndSp) {
  const Layout tp1{1, 1, 1}, tp2{2, 1, 1}, sp{2, 1, 1, 0, /*sp=*/true};
  Result a = Train(testing::TinyConfig(tp1, 2), tp1);
  Result b = Train(testing::TinyConfig(tp2, 2), tp2);
  Result c = Train(testing::TinyConfig(sp, 2), sp);
  ExpectArithmetic(b, tp2);
  ExpectArithmetic(c, sp);
  const int64_t one = Peak(a.ranks[0], MemoryCategory::kActivations);
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t tp = Peak(b.ranks[rank], MemoryCategory::kActivations);
    const int64_t tp_sp = Peak(c.ranks[rank], MemoryCategory::kActivations);
    EXPECT_LT(tp, one) << "rank " << rank;
    EXPECT_LT(tp_sp, tp) << "rank " << rank;
    EXPECT_LT(Current(b.ranks[rank], MemoryCategory::kParameters),
              Current(a.ranks[0], MemoryCategory::kParameters));
  }
}

// PP: each stage holds its layers only.
TEST(MemoryReportTest, PipelineStagesHoldTheirShare) {
  const Layout one{1, 1, 1}, pp2{1, 2, 1};
  Result a = Train(testing::TinyConfig(one, 2), one);
  Result b = Train(testing::TinyConfig(pp2, 2), pp2);
  ExpectArithmetic(b, pp2);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_LT(Current(b.ranks[rank], MemoryCategory::kParameters),
              Current(a.ranks[0], MemoryCategory::kParameters));
  }
}

TEST(MemoryReportTest, LogLineMetricsFileAndReport) {
  const Layout dp2{1, 1, 2};
  TrainConfig config = testing::TinyConfig(dp2, 2);
  config.log_interval = 1;
  config.memory_report = true;
  config.metrics_file = std::string(getenv("TEST_TMPDIR")) + "/memory.jsonl";
  Result r = Train(config, dp2);
  const std::vector<std::string>& log = r.run.log;
  int steps = 0, reports = 0, hints = 0;
  bool largest = false;
  for (const std::string& line : log) {
    if (line.find(" iteration ") == 0) {
      ++steps;
      EXPECT_NE(line.find(" | mem "), std::string::npos) << line;
      EXPECT_NE(line.find(" peak (max over ranks "), std::string::npos) << line;
    }
    if (line.find(" memory (rank ") == 0) {
      ++reports;
      EXPECT_NE(line.find("parameters "), std::string::npos) << line;
      EXPECT_NE(line.find(", optimizer "), std::string::npos) << line;
      EXPECT_NE(line.find(", activations "), std::string::npos) << line;
      EXPECT_NE(line.find(", total "), std::string::npos) << line;
    }
    largest |= line.find(" memory (largest over 2 ranks, peak)") == 0;
    if (line.find(" memory: ") == 0 && line.find("% of the peak): ") != std::string::npos) {
      ++hints;
    }
  }
  std::ostringstream all;
  for (const std::string& line : log) all << line << "\n";
  EXPECT_EQ(steps, 2) << all.str();
  EXPECT_EQ(reports, 2) << all.str();  // once, one line per rank
  EXPECT_TRUE(largest) << all.str();
  EXPECT_GE(hints, 3) << all.str();
  EXPECT_NE(all.str().find("--use-distributed-optimizer would divide them by DP 2"),
            std::string::npos)
      << all.str();

  std::ifstream in(config.metrics_file);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_NE(line.find("\"mem_peak_bytes\": "), std::string::npos) << line;
    EXPECT_NE(line.find("\"mem_peak_max_bytes\": "), std::string::npos) << line;
    EXPECT_NE(line.find("\"mem_peak_by_category\": {\"parameters\": "), std::string::npos)
        << line;
  }
  EXPECT_EQ(lines, 2);
}

// --device=cuda on the fake device: the same arithmetic on the device's
// account; the host holds no parameters.
TEST(MemoryReportTest, DeviceRunsCountDeviceMemory) {
  const Layout one{1, 1, 1};
  core::ops::testing::ScopedFakeDevice device;
  TrainConfig config = testing::TinyConfig(one, 2);
  config.device = DeviceKind::kCuda;
  Result r;
  r.ranks.resize(1);
  core::MemoryStats host;
  r.run = testing::Run(config, one, nullptr, [&](int, Trainer& t) {
    r.ranks[0].stats = t.RankMemory();
    r.ranks[0].padded_numel = t.model().params().padded_numel();
    for (const auto& [begin, end] : t.optimizer().owned()) r.ranks[0].owned_numel += end - begin;
    host = t.memory_ledger()->Stats(core::DeviceType::kCPU);
  });
  ASSERT_TRUE(r.run.status.ok()) << r.run.status;
  ExpectArithmetic(r, one);
  EXPECT_EQ(host.current_of(MemoryCategory::kParameters), 0);
}

}  // namespace
}  // namespace loom::train
