// --tensorboard-dir end to end: a tiny run (2 data-parallel ranks as
// threads) writes one event file, from rank 0, holding Megatron's scalars at
// the steps Megatron writes them, with the losses the trainer returns.

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "gtest/gtest.h"
#include "train/tensorboard/events.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;

// tag -> (step -> value)
using Series = std::map<std::string, std::map<int64_t, float>>;

Series ReadRun(const std::string& dir) {
  auto names = checkpoint::ListDir(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  if (!names.ok()) return {};
  EXPECT_EQ(names->size(), 1u) << "one file: only rank 0 writes";
  if (names->empty()) return {};
  EXPECT_EQ((*names)[0].rfind("events.out.tfevents.", 0), 0u) << (*names)[0];
  const std::string path = checkpoint::JoinPath(dir, (*names)[0]);
  auto events = tensorboard::ReadEvents(path);
  EXPECT_TRUE(events.ok()) << events.status();
  if (!events.ok() || events->empty()) return {};
  EXPECT_EQ((*events)[0].file_version(), tensorboard::kFileVersion);
  auto scalars = tensorboard::ReadScalars(path);
  EXPECT_TRUE(scalars.ok()) << scalars.status();
  Series series;
  for (const tensorboard::Scalar& s : *scalars) {
    EXPECT_TRUE(series[s.tag].emplace(s.step, s.value).second) << s.tag << " twice at " << s.step;
  }
  return series;
}

std::vector<int64_t> Steps(const std::map<int64_t, float>& s) {
  std::vector<int64_t> steps;
  for (const auto& [step, value] : s) steps.push_back(step);
  return steps;
}

TEST(TensorBoardTest, MegatronsScalarsFromRankZero) {
  const Layout l{1, 1, 2};
  TrainConfig c = testing::TinyConfig(l, 6);
  c.tensorboard_dir = std::string(std::getenv("TEST_TMPDIR")) + "/tb/dp2";
  c.tensorboard_log_interval = 2;
  c.log_interval = 3;
  c.eval_interval = 3;
  c.eval_iters = 1;
  c.log_memory_to_tensorboard = true;
  c.log_validation_ppl_to_tensorboard = true;
  TrainConfig final_config;
  core::MemoryStats memory;
  const testing::RunResult run = testing::Run(c, l, nullptr, [&](int rank, Trainer& t) {
    if (rank != 0) return;
    final_config = t.config();
    memory = t.RankMemory();
  });
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.losses.size(), 6u);
  Series s = ReadRun(c.tensorboard_dir);

  const std::set<std::string> want_tags = {
      "lm loss", "lm loss vs samples", "learning-rate", "learning-rate vs samples", "grad-norm",
      "grad-norm vs samples", "batch-size", "batch-size vs samples", "iteration-time",
      "throughput", "lm loss validation", "lm loss validation vs samples",
      "lm loss validation ppl", "lm loss validation ppl vs samples", "mem-allocated-bytes",
      "mem-max-allocated-bytes", "mem-max-allocated-bytes/parameters",
      "mem-max-allocated-bytes/gradients", "mem-max-allocated-bytes/optimizer",
      "mem-max-allocated-bytes/activations", "mem-max-allocated-bytes/communication",
      "mem-max-allocated-bytes/other"};  // no mem-reserved-bytes: a CPU has no cache
  std::set<std::string> tags;
  for (const auto& [tag, series] : s) tags.insert(tag);
  EXPECT_EQ(tags, want_tags);

  // Every --tensorboard-log-interval (2), at the iteration and at the samples
  // consumed (global batch 8): the step's own loss, as Train() returned it.
  const std::vector<int64_t> steps = {2, 4, 6}, samples = {16, 32, 48};
  EXPECT_EQ(Steps(s["lm loss"]), steps);
  EXPECT_EQ(Steps(s["lm loss vs samples"]), samples);
  for (int64_t i : steps) {
    EXPECT_EQ(s["lm loss"][i], static_cast<float>(run.losses[i - 1])) << i;
    EXPECT_EQ(s["lm loss vs samples"][8 * i], static_cast<float>(run.losses[i - 1])) << i;
    EXPECT_EQ(s["learning-rate"][i], final_config.lr.At(i - 1)) << i;
    EXPECT_EQ(s["batch-size"][i], 8.0f);
    EXPECT_GT(s["grad-norm"][i], 0.0f);
    EXPECT_GT(s["mem-allocated-bytes"][i], 0.0f);
    EXPECT_GE(s["mem-max-allocated-bytes"][i], s["mem-allocated-bytes"][i]);
    EXPECT_LE(s["mem-max-allocated-bytes"][i], static_cast<float>(memory.total_peak));
    EXPECT_GT(s["mem-max-allocated-bytes/parameters"][i], 0.0f);
  }
  EXPECT_EQ(Steps(s["learning-rate vs samples"]), samples);
  EXPECT_EQ(Steps(s["mem-allocated-bytes"]), steps);
  // Every --log-interval (3): averages over the interval.
  EXPECT_EQ(Steps(s["iteration-time"]), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(Steps(s["throughput"]), (std::vector<int64_t>{3, 6}));
  EXPECT_GT(s["iteration-time"][3], 0.0f);
  EXPECT_GT(s["throughput"][6], 0.0f);
  // Every --eval-interval (3); the last one is the trainer's last_eval_loss.
  EXPECT_EQ(Steps(s["lm loss validation"]), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(Steps(s["lm loss validation vs samples"]), (std::vector<int64_t>{24, 48}));
  EXPECT_EQ(s["lm loss validation"][6], static_cast<float>(run.eval_loss));
  EXPECT_EQ(s["lm loss validation ppl"][6], static_cast<float>(std::exp(run.eval_loss)));
}

// Under pipeline and tensor parallelism rank 0 (first stage, TP rank 0)
// still writes the global batch's loss: it is reduced to every rank.
TEST(TensorBoardTest, RankZeroHasTheLossUnderPipelineAndTensorParallelism) {
  const Layout l{2, 2, 1};
  TrainConfig c = testing::TinyConfig(l, 3);
  c.tensorboard_dir = std::string(std::getenv("TEST_TMPDIR")) + "/tb/tp2_pp2";
  const testing::RunResult run = testing::Run(c, l);
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.losses.size(), 3u);
  Series s = ReadRun(c.tensorboard_dir);
  EXPECT_EQ(Steps(s["lm loss"]), (std::vector<int64_t>{1, 2, 3}));  // default interval 1
  for (int64_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(s["lm loss"][i], static_cast<float>(run.losses[i - 1])) << i;
  }
  EXPECT_EQ(s.count("mem-allocated-bytes"), 0u);  // not asked for
  EXPECT_EQ(s.count("lm loss validation"), 0u);   // no evaluation
}

TEST(TensorBoardTest, UnwritableDirFailsBeforeTrainingNamingIt) {
  const Layout l{1, 1, 1};
  const std::string file = std::string(std::getenv("TEST_TMPDIR")) + "/a_file";
  ASSERT_TRUE(checkpoint::WriteFileDurably(file, "x").ok());
  TrainConfig c = testing::TinyConfig(l, 2);
  c.tensorboard_dir = file + "/tb";
  const testing::RunResult run = testing::Run(c, l);
  ASSERT_FALSE(run.status.ok());
  EXPECT_NE(run.status.message().find("--tensorboard-dir=" + file + "/tb: "), std::string::npos)
      << run.status;
  EXPECT_TRUE(run.losses.empty());
}

}  // namespace
}  // namespace loom::train
