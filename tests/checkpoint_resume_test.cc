// Resuming in the same layout is bit-exact: (train 20, save, stop, resume,
// train 20 more) gives the loss curve of an uninterrupted 40-iteration run,
// bit for bit, for TP, PP (every schedule), DP, the distributed optimizer and
// ZeRO-2 (optim_grads).
#include <cstring>

#include "checkpoint/file_util.h"
#include "checkpoint/reader.h"
#include "train/test_util.h"
#include "gtest/gtest.h"

namespace loom::checkpoint {
namespace testing = ::loom::train::testing;
namespace {

using testing::Layout;

class ResumeTest : public ::testing::TestWithParam<std::tuple<Layout, bool>> {};

TEST_P(ResumeTest, SaveStopResumeIsBitExact) {
  const Layout l = std::get<0>(GetParam());
  const bool async = std::get<1>(GetParam());
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/resume_" +
                          std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                          "_" + std::to_string(reinterpret_cast<uintptr_t>(&l));
  ASSERT_TRUE(RemoveTree(dir).ok());
  // The uninterrupted run; it also saves at iteration 20 (and 40).
  train::TrainConfig c = testing::TinyConfig(l, 40);
  c.save = dir;
  c.save_interval = 20;
  c.checkpoint.async_save = async;
  testing::RunResult full = testing::Run(c, l);
  ASSERT_TRUE(full.status.ok()) << full.status;
  ASSERT_EQ(full.losses.size(), 40u);
  ASSERT_TRUE(IsDirectory(dir + "/iter_0000020"));
  ASSERT_TRUE(IsDirectory(dir + "/iter_0000040"));
  EXPECT_EQ(*ReadFile(dir + "/latest"), "iter_0000040\n");
  auto reader = CheckpointReader::Open(dir + "/iter_0000020");
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->VerifyAll().ok());
  EXPECT_EQ((*reader)->manifest().training().iteration(), 20);
  EXPECT_EQ((*reader)->manifest().training().consumed_samples(), 20 * c.global_batch_size);
  EXPECT_EQ((*reader)->manifest().files_size(), l.tp * l.pp * l.dp);

  // Resume from iteration 20 in a fresh world.
  train::TrainConfig r = testing::TinyConfig(l, 40);
  r.load = dir;
  r.checkpoint.load_iteration = 20;
  testing::RunResult resumed = testing::Run(r, l);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  ASSERT_EQ(resumed.losses.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    // Bit for bit, not approximately.
    EXPECT_EQ(std::memcmp(&resumed.losses[i], &full.losses[20 + i], sizeof(double)), 0)
        << l.Describe() << " iteration " << 21 + i << ": " << resumed.losses[i] << " vs "
        << full.losses[20 + i];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ResumeTest,
    ::testing::Values(std::make_tuple(Layout{2, 1, 1}, false),
                      std::make_tuple(Layout{1, 2, 1, 0, false, false, "1f1b"}, false),
                      std::make_tuple(Layout{1, 2, 1, 0, false, false, "gpipe"}, false),
                      std::make_tuple(Layout{1, 2, 1, 1, false, false, "interleaved"}, false),
                      std::make_tuple(Layout{1, 1, 2}, false),
                      std::make_tuple(Layout{1, 1, 2, 0, false, true}, false),
                      std::make_tuple(Layout{2, 1, 2, 0, true, true}, true),
                      // ZeRO-2: nothing of the gradient shard outlives a step
                      std::make_tuple(testing::OptimGrads({1, 1, 2}), false),
                      std::make_tuple(testing::OptimGrads({2, 1, 2, 0, true, false, "1f1b", true}),
                                      true)));

}  // namespace
}  // namespace loom::checkpoint
