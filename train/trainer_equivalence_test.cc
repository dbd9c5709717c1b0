// The same model and data trained for 20 iterations in every layout —
// (TP, PP, DP) = (1,1,1), (2,1,1), (1,2,1), (1,1,2), (2,2,1), interleaved
// PP, sequence parallelism, and the distributed optimizer — gives the same
// loss curve, with dropout on (counter-based masks make it layout-free).
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "comm/local/communicator.h"
#include "gtest/gtest.h"
#include "train/data/indexed_dataset.h"
#include "train/trainer.h"

namespace loom::train {
namespace {

// Per-step losses of every layout stay within 1e-6 relative of the reference
// (measured: about 2e-9; the f32 rounding of the parallel sums differs, and
// Adam's division by sqrt(v) could amplify it over longer runs).
constexpr double kTolerance = 1e-6;
constexpr int kIters = 20;

std::string MakeDataset() {
  const std::string prefix = std::string(getenv("TEST_TMPDIR")) + "/corpus";
  auto w = IndexedDatasetWriter::Create(prefix, TokenType::kU16);
  std::mt19937 rng(5);
  for (int doc = 0; doc < 200; ++doc) {
    // Learnable text: runs of a repeating pattern with noise.
    std::vector<int32_t> t(20 + rng() % 40);
    const int base = 'a' + rng() % 20;
    for (size_t i = 0; i < t.size(); ++i) t[i] = (rng() % 8 == 0) ? ' ' : base + (i % 5);
    EXPECT_TRUE((*w)->AddSequence(t.data(), t.size()).ok());
    EXPECT_TRUE((*w)->EndDocument().ok());
  }
  EXPECT_TRUE((*w)->Finalize().ok());
  return prefix;
}

struct Layout {
  int tp, pp, dp;
  int vp_layers = 0;  // --num-layers-per-virtual-pipeline-stage
  bool sp = false;
  bool distributed = false;
  std::string schedule = "1f1b";
  bool overlap = false;  // --overlap-grad-reduce
};

std::vector<double> Train(const std::string& data, const Layout& l) {
  TrainConfig c;
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 16;
  c.model.make_vocab_size_divisible_by = 8;
  c.tensor_model_parallel_size = l.tp;
  c.pipeline_model_parallel_size = l.pp;
  c.num_layers_per_virtual_pipeline_stage = l.vp_layers;
  c.pipeline_schedule = l.schedule;
  c.sequence_parallel = l.sp;
  c.optimizer.distributed = l.distributed;
  c.overlap_grad_reduce = l.overlap;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.train_iters = kIters;
  c.lr.lr = 3e-3f;
  c.lr.min_lr = 3e-4f;
  c.lr.warmup_iters = 2;
  c.hidden_dropout = 0.1f;
  c.data_path = data;
  c.data_cache_dir = getenv("TEST_TMPDIR");
  c.eval_interval = 0;
  c.eval_iters = 0;
  c.log_interval = 100;
  c.peak_flops = 1e9;  // skip the start-up GEMM measurement
  const int world = l.tp * l.pp * l.dp;
  EXPECT_TRUE(Finalize(&c, world).ok());
  auto comms = comm::local::CreateWorld(world);
  EXPECT_TRUE(comms.ok());
  std::vector<double> losses;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto t = Trainer::Create(c, (*comms)[r].get(), [](const std::string&) {});
      absl::Status s = t.ok() ? (*t)->Train() : t.status();
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
      if (r == 0 && s.ok()) {
        absl::MutexLock lock(&mu);
        losses = (*t)->losses();
      }
    });
  }
  for (auto& t : threads) t.join();
  return losses;
}

TEST(TrainerEquivalenceTest, EveryLayoutGivesTheSameLossCurve) {
  const std::string data = MakeDataset();
  const std::vector<double> ref = Train(data, {1, 1, 1});
  ASSERT_EQ(ref.size(), static_cast<size_t>(kIters));
  EXPECT_LT(ref.back(), ref.front() - 0.5) << "the reference run must learn";
  const std::vector<Layout> layouts = {
      {2, 1, 1},
      {1, 2, 1},
      {1, 1, 2},
      {2, 2, 1},
      {1, 1, 2, 0, false, true},           // distributed optimizer
      {2, 1, 2, 0, true, true},            // TP + SP + DP + distributed optimizer
      {1, 2, 1, 1, false, false, "interleaved"},
      {1, 2, 1, 0, false, false, "gpipe"},
      {1, 1, 2, 0, false, false, "1f1b", true},  // --overlap-grad-reduce
      {2, 2, 2, 0, true, false, "1f1b", true},   // TP + SP + PP + DP, overlapped
  };
  for (const Layout& l : layouts) {
    const std::vector<double> got = Train(data, l);
    ASSERT_EQ(got.size(), ref.size());
    for (int i = 0; i < kIters; ++i) {
      EXPECT_NEAR(got[i], ref[i], kTolerance * ref[i])
          << "TP " << l.tp << " PP " << l.pp << " DP " << l.dp << " vp-layers " << l.vp_layers
          << (l.sp ? " SP" : "") << (l.distributed ? " dist-opt" : "")
          << (l.overlap ? " overlap" : "") << " " << l.schedule
          << ", iteration " << i + 1;
    }
  }
}

}  // namespace
}  // namespace loom::train
