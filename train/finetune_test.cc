// --finetune (the checkpoint's weights only: iteration 0, fresh Adam state,
// LR schedule and data position) and --skip-train (evaluate only) on tiny
// runs over the local backend.

#include <cmath>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using testing::Layout;

std::string TmpDir(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

std::vector<float> Weights(Trainer& t) {
  const core::Tensor& v = t.model().params().flat_values();
  return std::vector<float>(v.data<float>(), v.data<float>() + v.numel());
}

void SetWeights(Trainer& t, const std::vector<float>& w) {
  const core::Tensor& v = t.model().params().flat_values();
  ASSERT_EQ(static_cast<size_t>(v.numel()), w.size());
  float* dst = const_cast<float*>(v.data<float>());
  std::copy(w.begin(), w.end(), dst);
  ASSERT_TRUE(t.model().params().SyncComputeCopy().ok());
}

constexpr int kSaved = 6, kFinetune = 8;

// Trains kSaved iterations (optimizer state saved) and returns rank 0's weights then.
std::vector<float> SaveReference(const std::string& dir, bool save_optim) {
  TrainConfig c = testing::TinyConfig({1, 1, 1}, kSaved);
  c.save = dir;
  c.checkpoint.save_optim = save_optim;
  c.eval_interval = kSaved;
  c.eval_iters = 2;
  std::vector<float> w;
  testing::RunResult r = testing::Run(c, {1, 1, 1}, nullptr, [&](int rank, Trainer& t) {
    if (rank == 0) w = Weights(t);
  });
  EXPECT_TRUE(r.status.ok()) << r.status;
  return w;
}

TEST(FinetuneTest, StartsAtIterationZeroFromTheCheckpointsWeights) {
  const std::string dir = TmpDir("finetune_src");
  const std::vector<float> saved = SaveReference(dir, /*save_optim=*/true);
  ASSERT_FALSE(saved.empty());

  // A run that starts from those weights by hand: fresh everything else.
  testing::RunResult from_weights = testing::Run(
      testing::TinyConfig({1, 1, 1}, kFinetune), {1, 1, 1},
      [&](int, Trainer& t) { SetWeights(t, saved); });
  ASSERT_TRUE(from_weights.status.ok()) << from_weights.status;
  ASSERT_EQ(from_weights.losses.size(), static_cast<size_t>(kFinetune));

  for (const Layout& l : {Layout{1, 1, 1}, Layout{2, 1, 1}, Layout{1, 2, 1}}) {
    TrainConfig c = testing::TinyConfig(l, kFinetune);
    c.load = dir;
    c.checkpoint.finetune = true;
    std::vector<float> loaded;
    int64_t iteration = -1, consumed = -1, step = -1;
    testing::RunResult r = testing::Run(c, l, [&](int rank, Trainer& t) {
      if (rank != 0) return;
      loaded = Weights(t);
      iteration = t.iteration();
      consumed = t.consumed_samples();
      step = t.optimizer().step_count();
    });
    ASSERT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
    EXPECT_EQ(iteration, 0) << l.Describe();
    EXPECT_EQ(consumed, 0) << l.Describe();
    EXPECT_EQ(step, 0) << l.Describe();
    if (l.tp == 1 && l.pp == 1) {
      EXPECT_EQ(loaded, saved);  // bit for bit
    }
    ASSERT_EQ(r.losses.size(), static_cast<size_t>(kFinetune)) << l.Describe();
    for (int i = 0; i < kFinetune; ++i) {
      EXPECT_NEAR(r.losses[i], from_weights.losses[i], 1e-6 * from_weights.losses[i])
          << l.Describe() << ", iteration " << i + 1;
    }
    bool logged = false;
    for (const std::string& line : r.log) logged |= line.find("--finetune") != std::string::npos;
    EXPECT_TRUE(logged) << l.Describe();
  }
}

TEST(FinetuneTest, CheckpointWithoutOptimizerStateNeedsFinetuneToTrain) {
  const std::string dir = TmpDir("no_optim");
  SaveReference(dir, /*save_optim=*/false);
  TrainConfig resume = testing::TinyConfig({1, 1, 1}, kFinetune);
  resume.load = dir;
  testing::RunResult r = testing::Run(resume, {1, 1, 1});
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition) << r.status;
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("has no optimizer state"));
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("pass --finetune"));

  resume.checkpoint.finetune = true;
  r = testing::Run(resume, {1, 1, 1});
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.losses.size(), static_cast<size_t>(kFinetune));

  // Evaluating needs no optimizer state.
  TrainConfig eval = testing::TinyConfig({1, 1, 1}, kFinetune);
  eval.load = dir;
  eval.skip_train = true;
  eval.eval_iters = 2;
  r = testing::Run(eval, {1, 1, 1});
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(std::isfinite(r.eval_loss));
}

TEST(FinetuneTest, FinetuneNeedsLoad) {
  TrainConfig c = testing::TinyConfig({1, 1, 1}, 2);
  c.checkpoint.finetune = true;
  absl::Status s = Finalize(&c, 1);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--finetune needs --load"));
}

TEST(SkipTrainTest, EvaluatesTheLoadedModelOnly) {
  const std::string dir = TmpDir("skip_src");
  TrainConfig c = testing::TinyConfig({1, 1, 1}, kSaved);
  c.save = dir;
  c.eval_interval = kSaved;
  c.eval_iters = 2;
  testing::RunResult ref = testing::Run(c, {1, 1, 1});
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_TRUE(std::isfinite(ref.eval_loss));

  for (const Layout& l : {Layout{1, 1, 1}, Layout{2, 2, 1}}) {
    TrainConfig e = testing::TinyConfig(l, 100);
    e.load = dir;
    e.skip_train = true;
    e.eval_iters = 2;
    e.save = TmpDir("skip_out_" + std::to_string(l.tp) + std::to_string(l.pp));
    testing::RunResult r = testing::Run(e, l);
    ASSERT_TRUE(r.status.ok()) << l.Describe() << ": " << r.status;
    EXPECT_TRUE(r.losses.empty()) << l.Describe();
    EXPECT_NEAR(r.eval_loss, ref.eval_loss, 1e-6 * ref.eval_loss) << l.Describe();
    bool logged = false;
    for (const std::string& line : r.log) {
      logged |= line.find("validation loss at iteration 6") != std::string::npos;
    }
    EXPECT_TRUE(logged) << l.Describe();
    EXPECT_NE(access((e.save + "/latest").c_str(), F_OK), 0) << "nothing saved: " << e.save;
  }
}

// Scoring an imported model on a validation-only corpus, as in Megatron:
// --skip-train (with --train-iters=0 or not) needs no train split.
TEST(SkipTrainTest, ValidationOnlyCorpusNeedsNoTrainSplit) {
  const std::string dir = TmpDir("skip_valid_only_src");
  TrainConfig c = testing::TinyConfig({1, 1, 1}, kSaved);
  c.save = dir;
  ASSERT_TRUE(testing::Run(c, {1, 1, 1}).status.ok());

  for (int64_t iters : {int64_t{100}, int64_t{0}}) {
    TrainConfig e = testing::TinyConfig({1, 1, 1}, iters == 0 ? 1 : iters);
    e.train_iters = iters;
    e.load = dir;
    e.skip_train = true;
    e.eval_iters = 2;
    e.split = "0,100,0";
    testing::RunResult r = testing::Run(e, {1, 1, 1});
    ASSERT_TRUE(r.status.ok()) << "--train-iters=" << iters << ": " << r.status;
    EXPECT_TRUE(std::isfinite(r.eval_loss));
    EXPECT_TRUE(r.losses.empty());
  }
  // Training on it still needs a train split, and --train-iters=0 needs --skip-train.
  TrainConfig train = testing::TinyConfig({1, 1, 1}, 2);
  train.split = "0,100,0";
  testing::RunResult r = testing::Run(train, {1, 1, 1});
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("the train split holds 0 tokens"));
  train.split = "969,30,1";
  train.train_iters = 0;
  EXPECT_THAT(std::string(Finalize(&train, 1).message()), HasSubstr("0 only with --skip-train"));
}

}  // namespace
}  // namespace loom::train
