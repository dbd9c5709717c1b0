// Megatron's exit flags and the restart path end with exactly the model of a
// run that was never interrupted: a run stopped by --exit-interval (or by
// SIGTERM with --exit-signal-handler) and started again as a restart would
// be (LOOM_RESTART_COUNT=1, --save, no --load) resumes from its checkpoint
// in --save, and its later checkpoints and losses are bit-identical to the
// uninterrupted run's. Ranks are threads of this test.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "checkpoint/file_util.h"
#include "checkpoint/format.h"
#include "comm/launch/heartbeat.h"
#include "gtest/gtest.h"
#include "train/exit_signal.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using checkpoint::JoinPath;
using checkpoint::ReadFile;
using testing::Layout;

constexpr int kIters = 12;

std::string FreshDir(const std::string& name) {
  const std::string dir = JoinPath(getenv("TEST_TMPDIR"), name);
  EXPECT_TRUE(checkpoint::RemoveTree(dir).ok());
  return dir;
}

// Runs as the agent's restart `restart` would start it (0: the first start).
testing::RunResult RunAsStart(const TrainConfig& c, const Layout& l, int restart,
                              Trainer::ExitReason* exit_reason = nullptr) {
  if (restart > 0) {
    setenv("LOOM_RESTART_COUNT", std::to_string(restart).c_str(), 1);
  } else {
    unsetenv("LOOM_RESTART_COUNT");
  }
  testing::RunResult r = testing::Run(c, l, nullptr, [&](int rank, Trainer& t) {
    if (rank == 0 && exit_reason != nullptr) *exit_reason = t.exit_reason();
  });
  unsetenv("LOOM_RESTART_COUNT");
  return r;
}

bool LogHas(const testing::RunResult& r, const std::string& text) {
  for (const std::string& line : r.log) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

// Every file of checkpoint `iteration` in `a` and `b` byte for byte
// (manifest.pb holds every shard's CRC32C, the shards every value).
void ExpectSameCheckpoint(const std::string& a, const std::string& b, int iteration) {
  const std::string name = checkpoint::IterDirName(iteration);
  auto files = checkpoint::ListDir(JoinPath(a, name));
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_GE(files->size(), 3u);  // manifest.pb, manifest.txt, shards
  for (const std::string& f : *files) {
    auto x = ReadFile(JoinPath(JoinPath(a, name), f));
    auto y = ReadFile(JoinPath(JoinPath(b, name), f));
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(*x == *y) << name << "/" << f << " differs between " << a << " and " << b;
  }
}

void ExpectBitIdentical(const std::vector<double>& got, const std::vector<double>& want,
                        size_t offset) {
  ASSERT_EQ(got.size() + offset, want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got[i], &want[offset + i], sizeof(double)), 0)
        << "iteration " << offset + i + 1 << ": " << got[i] << " vs " << want[offset + i];
  }
}

// A run that stopped itself after `steps` steps: it succeeded, rank 0 saw
// `reason` (`why`, set by RunAsStart) and logged `message`, and with --save
// (`save`, "" for none) the checkpoint of the exit step is the latest.
void ExpectStopped(const testing::RunResult& r, Trainer::ExitReason why,
                   Trainer::ExitReason reason, int steps, const std::string& message,
                   const std::string& save) {
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(why, reason);
  EXPECT_EQ(r.losses.size(), static_cast<size_t>(steps));
  EXPECT_TRUE(LogHas(r, message)) << absl::StrJoin(r.log, "\n");
  if (save.empty()) return;
  auto latest = ReadFile(JoinPath(save, "latest"));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, checkpoint::IterDirName(steps) + "\n");
}

TrainConfig Config(const Layout& l, const std::string& save) {
  TrainConfig c = testing::TinyConfig(l, kIters);
  c.save = save;
  c.save_interval = 4;  // saves at 4, 8, 12: the restart's must match too
  c.eval_interval = 5;  // evaluation does not move the data or the RNG
  c.eval_iters = 1;
  return c;
}

// The agent's heartbeat page (comm/launch/heartbeat.h), mapped by this
// process on its first beat: made before any test runs.
comm::launch::HeartbeatPage* g_heartbeat = nullptr;
class HeartbeatEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    auto page = comm::launch::HeartbeatPage::Create();
    ASSERT_TRUE(page.ok()) << page.status();
    g_heartbeat = page->release();
    setenv("LOOM_HEARTBEAT_FD", std::to_string(g_heartbeat->fd()).c_str(), 1);
  }
};
::testing::Environment* const kHeartbeat =
    ::testing::AddGlobalTestEnvironment(new HeartbeatEnvironment);

// A rank that makes progress beats in every step (with the iteration it
// started from), in evaluation, around saves, and says it is exiting at the end.
TEST(ExitAndRestartTest, BeatsEveryStepEvaluationAndSave) {
  ASSERT_NE(g_heartbeat, nullptr);
  const Layout l{1, 1, 1};  // one rank: its beats are the page's
  TrainConfig c = Config(l, FreshDir("heartbeat_ckpt"));
  c.log_interval = 1;
  c.train_iters = 10;
  uint64_t beats = g_heartbeat->Read().beats;
  std::vector<std::string> seen;
  testing::RunResult r = testing::Run(c, l, nullptr, nullptr, [&](const std::string& line) {
    const comm::launch::HeartbeatReading now = g_heartbeat->Read();
    if (line.find("loom: ") == 0) return;  // set-up lines: no beat between them
    EXPECT_GT(now.beats, beats) << "no beat since the line before: " << line;
    beats = now.beats;
    int it = 0;
    if (std::sscanf(line.c_str(), " iteration %d/", &it) == 1) {
      EXPECT_EQ(now.phase, comm::launch::Phase::kTrain) << line;
      EXPECT_EQ(now.iteration, it - 1) << line;  // beaten as step `it` ran
      seen.push_back("step");
    } else if (line.find(" validation loss at iteration") == 0) {
      EXPECT_EQ(now.phase, comm::launch::Phase::kEval) << line;
      seen.push_back("eval");
    } else if (line.find(" saved checkpoint at iteration") == 0) {
      EXPECT_EQ(now.phase, comm::launch::Phase::kSave) << line;
      seen.push_back("save");
    }
  });
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(absl::StrJoin(seen, " "),
            "step step step step save step eval step step step save step step eval save");
  const comm::launch::HeartbeatReading end = g_heartbeat->Read();
  EXPECT_EQ(end.phase, comm::launch::Phase::kExiting);
  EXPECT_EQ(end.iteration, 10);
}

TEST(ExitAndRestartTest, ExitIntervalThenRestartEndsBitIdentical) {
  const Layout l{1, 1, 2, 0, false, true};  // DP 2, distributed optimizer
  const std::string full_dir = FreshDir("full"), dir = FreshDir("interrupted");
  testing::RunResult full = RunAsStart(Config(l, full_dir), l, 0);
  ASSERT_TRUE(full.status.ok()) << full.status;
  ASSERT_EQ(full.losses.size(), static_cast<size_t>(kIters));

  TrainConfig c = Config(l, dir);
  c.exit_interval = 6;  // not a save iteration: the exit saves on its own
  Trainer::ExitReason why = Trainer::ExitReason::kNone;
  testing::RunResult first = RunAsStart(c, l, 0, &why);
  ASSERT_NO_FATAL_FAILURE(ExpectStopped(first, why, Trainer::ExitReason::kInterval, 6,
                                        "exit interval: iteration 6 is a multiple of "
                                        "--exit-interval=6; saved checkpoint, exiting",
                                        dir));
  ExpectBitIdentical(first.losses, std::vector<double>(full.losses.begin(),
                                                       full.losses.begin() + 6),
                     0);

  // The restart: same flags, no --load. At iteration 12 (the last) the
  // exit interval does not stop it: the run completes.
  why = Trainer::ExitReason::kNone;
  testing::RunResult second = RunAsStart(c, l, 1, &why);
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(why, Trainer::ExitReason::kNone);
  EXPECT_TRUE(LogHas(second, "restart 1: resuming from " + dir + "/iter_0000006 iteration 6"))
      << absl::StrJoin(second.log, "\n");
  ExpectBitIdentical(second.losses, full.losses, 6);
  EXPECT_EQ(*ReadFile(JoinPath(dir, "latest")), "iter_0000012\n");
  for (int it : {4, 8, 12}) ExpectSameCheckpoint(full_dir, dir, it);
}

TEST(ExitAndRestartTest, SigtermThenRestartEndsBitIdentical) {
  const Layout l{1, 2, 1};  // PP 2
  const std::string full_dir = FreshDir("full_pp"), dir = FreshDir("sigterm_pp");
  testing::RunResult full = RunAsStart(Config(l, full_dir), l, 0);
  ASSERT_TRUE(full.status.ok()) << full.status;

  TrainConfig c = Config(l, dir);
  c.exit_signal_handler = true;
  c.checkpoint.async_save = true;  // the exit waits for the background write
  c.log_interval = 1;
  ResetExitSignalForTesting();
  // SIGTERM reaches the process as rank 0 logs iteration 5 (the handler is
  // installed by then): every rank finishes step 5, saves, and stops.
  Trainer::ExitReason why = Trainer::ExitReason::kNone;
  testing::RunResult first = testing::Run(
      c, l, nullptr,
      [&](int rank, Trainer& t) {
        if (rank == 0) why = t.exit_reason();
      },
      [](const std::string& line) {
        if (line.find(" iteration      5/") == 0) std::raise(SIGTERM);
      });
  ResetExitSignalForTesting();
  ASSERT_NO_FATAL_FAILURE(ExpectStopped(first, why, Trainer::ExitReason::kSignal, 5,
                                        "exit signal handler: SIGTERM received at iteration 5; "
                                        "saved checkpoint, exiting",
                                        dir));

  c.exit_signal_handler = false;
  testing::RunResult second = RunAsStart(c, l, 1);
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_TRUE(LogHas(second, "restart 1: resuming from " + dir + "/iter_0000005 iteration 5"))
      << absl::StrJoin(second.log, "\n");
  ExpectBitIdentical(second.losses, full.losses, 5);
  for (int it : {8, 12}) ExpectSameCheckpoint(full_dir, dir, it);
}

TEST(ExitAndRestartTest, ExitDurationStopsAfterTheStepItPassed) {
  const Layout l{2, 1, 1};
  const std::string dir = FreshDir("duration");
  TrainConfig c = Config(l, dir);
  c.exit_duration_in_mins = 1e-9;  // already past after the first step
  Trainer::ExitReason why = Trainer::ExitReason::kNone;
  testing::RunResult r = RunAsStart(c, l, 0, &why);
  ASSERT_NO_FATAL_FAILURE(ExpectStopped(
      r, why, Trainer::ExitReason::kDuration, 1,
      "(--exit-duration-in-mins=1e-09) at iteration 1; saved checkpoint, exiting", dir));
  // Without --save the run still stops; nothing is written.
  c.save.clear();
  c.save_interval = 0;
  why = Trainer::ExitReason::kNone;
  r = RunAsStart(c, l, 0, &why);
  ExpectStopped(r, why, Trainer::ExitReason::kDuration, 1,
                "at iteration 1; nothing saved (no --save), exiting", c.save);
}

// A restart with nothing of this run in --save starts where the first start
// did: at iteration 0 (an empty folder, or a checkpoint another run left).
TEST(ExitAndRestartTest, RestartWithoutItsCheckpointStartsFromZero) {
  const Layout l{1, 1, 1};
  const std::string dir = FreshDir("nothing_yet");
  testing::RunResult full = RunAsStart(testing::TinyConfig(l, 6), l, 0);
  ASSERT_TRUE(full.status.ok()) << full.status;

  TrainConfig c = testing::TinyConfig(l, 6);
  c.save = dir;
  testing::RunResult r = RunAsStart(c, l, 2);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(LogHas(r, "restart 2: no complete checkpoint in " + dir +
                            " yet: starting from iteration 0"))
      << absl::StrJoin(r.log, "\n");
  ExpectBitIdentical(r.losses, full.losses, 0);

  // --save now holds a checkpoint of a run with other --train-iters.
  TrainConfig other = c;
  other.train_iters = 8;
  r = RunAsStart(other, l, 1);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(LogHas(r, "restart 1: not resuming from " + dir + "/iter_0000006 (--train-iters "
                            "is 8 but was 6 when it was saved): starting from iteration 0"))
      << absl::StrJoin(r.log, "\n");
  EXPECT_EQ(r.losses.size(), 8u);

  // With --load the restart path is not taken: --load is loaded as on the
  // first start (here: the run just saved at iteration 8, nothing left).
  TrainConfig with_load = other;
  with_load.load = dir;
  r = RunAsStart(with_load, l, 1);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_FALSE(LogHas(r, "restart 1")) << absl::StrJoin(r.log, "\n");
  EXPECT_TRUE(r.losses.empty());
}

}  // namespace
}  // namespace loom::train
