// A save killed with SIGKILL at a random moment (several seeds) never leaves
// `latest` pointing at a broken checkpoint: after every kill, the checkpoint
// `latest` names verifies (every file's CRC32C, every tensor covered) and
// holds exactly the state of the iteration it claims; --keep-last pruning
// and leftovers of killed saves are handled by the next save.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/file_util.h"
#include "checkpoint/reader.h"
#include "comm/local/communicator.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_config.h"

namespace loom::checkpoint {
namespace {

layers::GptConfig Model() {
  layers::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.seq_length = 64;
  c.vocab_size = 1000;
  c.make_vocab_size_divisible_by = 128;
  return c;
}

// The value every element holds at `iteration` (state 0: param, 1, 2: moments).
float Expected(int64_t iteration, int state) { return static_cast<float>(iteration * 3 + state); }

// The child: saves iterations start, start+1, ... forever (until killed).
[[noreturn]] void SaveForever(const std::string& dir, int64_t start) {
  const layers::GptConfig c = Model();
  auto params = layers::ParamBuffer::Create(layers::ModelParamSpecs(c), 0, 1, 1);
  auto world = comm::local::CreateWorld(1);
  if (!params.ok() || !world.ok()) _exit(3);
  core::Tensor m = *core::Tensor::Zeros(core::Shape{params->padded_numel()}, core::DType::kF32);
  core::Tensor v = *core::Tensor::Zeros(core::Shape{params->padded_numel()}, core::DType::kF32);
  RankView view;
  view.model = c;
  view.params = &*params;
  view.exp_avg = &m;
  view.exp_avg_sq = &v;
  view.moment_ranges = {{0, params->padded_numel()}};
  SaveOptions o;
  o.dir = dir;
  o.keep_last = 2;
  auto ckpt = Checkpointer::Create((*world)[0].get(), o);
  if (!ckpt.ok()) _exit(4);
  for (int64_t it = start;; ++it) {
    float* p = params->flat_values().data<float>();
    for (int64_t i = 0; i < params->padded_numel(); ++i) {
      p[i] = Expected(it, 0);
      m.data<float>()[i] = Expected(it, 1);
      v.data<float>()[i] = Expected(it, 2);
    }
    Manifest h;
    h.mutable_training()->set_iteration(it);
    *h.mutable_model() = ModelConfigProto(c);
    if (!(*ckpt)->Save(view, h).ok()) _exit(5);
  }
}

// Checks the checkpoint `latest` names; returns its iteration (-1: none yet).
int64_t CheckLatest(const std::string& dir) {
  if (!PathExists(dir + "/latest")) {
    // Killed before the first save completed: no complete checkpoint may exist.
    auto names = ListDir(dir);
    if (names.ok()) {
      for (const auto& n : *names) EXPECT_FALSE(ParseIterDirName(n).has_value()) << n;
    }
    return -1;
  }
  auto path = ResolveCheckpoint(dir, std::nullopt);
  EXPECT_TRUE(path.ok()) << path.status();
  if (!path.ok()) return -2;
  auto reader = CheckpointReader::Open(*path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return -2;
  EXPECT_TRUE((*reader)->VerifyAll().ok()) << (*reader)->VerifyAll();
  const int64_t it = (*reader)->manifest().training().iteration();
  for (const TensorInfo& t : (*reader)->manifest().tensors()) {
    auto values = (*reader)->ReadGlobal(t.name(), t.state());
    EXPECT_TRUE(values.ok()) << values.status();
    if (!values.ok()) return -2;
    const float want = Expected(it, t.state() - 1);
    for (float x : *values) {
      if (x != want) {
        ADD_FAILURE() << t.name() << " holds " << x << " in the checkpoint of iteration " << it;
        return -2;
      }
    }
  }
  return it;
}

TEST(CrashTest, KillDuringSaveNeverBreaksLatest) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/crash";
  ASSERT_TRUE(RemoveTree(dir).ok());
  int64_t last = -1;
  int completed_rounds = 0;
  for (int seed = 1; seed <= 10; ++seed) {
    std::mt19937 rng(seed);
    const int delay_ms = 50 + static_cast<int>(rng() % 1200);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) SaveForever(dir, last + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited by itself: code "
                                     << WEXITSTATUS(status) << " (seed " << seed << ")";
    const int64_t it = CheckLatest(dir);
    ASSERT_GE(it, -1) << "seed " << seed << " (killed after " << delay_ms << " ms)";
    EXPECT_GE(it, last) << "latest went backwards";
    if (it > last) ++completed_rounds;
    last = std::max(last, it);
    // --keep-last=2: never more than 2 complete checkpoints (+1 while one commits).
    int complete = 0;
    auto names = ListDir(dir);  // absent when killed before the first save began
    if (names.ok()) {
      for (const auto& n : *names) complete += ParseIterDirName(n).has_value();
    }
    EXPECT_LE(complete, 3);
  }
  EXPECT_GT(completed_rounds, 3) << "the kills should land after some saves completed";
}

}  // namespace
}  // namespace loom::checkpoint
