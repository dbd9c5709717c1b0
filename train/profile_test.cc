// --timing-log-level and --profile end to end on the local backend (ranks
// are threads): Megatron's timer lines after the log line, <timer>-time
// scalars, and one merged Chrome trace whose spans name what ran.

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "profile/chrome_trace.h"
#include "train/tensorboard/events.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using nlohmann::json;
using testing::Layout;

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string TmpDir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// The log's records split into lines (a timer block is one record with its log line).
testing::RunResult Lines(testing::RunResult r) {
  std::vector<std::string> lines;
  for (const std::string& record : r.log) {
    size_t start = 0;
    for (size_t nl; (nl = record.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(record.substr(start, nl - start));
    }
    lines.push_back(record.substr(start));
  }
  r.log = lines;
  return r;
}

// The lines after the first "(min, max)" header that follows a log line.
std::vector<std::string> TimerNamesAfter(const std::vector<std::string>& log, size_t from) {
  std::vector<std::string> names;
  for (size_t i = from + 1; i < log.size() && log[i].rfind("    ", 0) == 0; ++i) {
    names.push_back(log[i].substr(4, log[i].find(' ', 4) - 4));
  }
  return names;
}

TEST(ProfileTest, PipelineRunLogsTimersAndWritesOneMergedTrace) {
  const Layout l{1, 2, 1};  // PP 2: 4 micro-batches of 2 per step, 1F1B
  TrainConfig c = testing::TinyConfig(l, 4);
  c.log_interval = 2;
  c.timing_log_level = 2;
  c.profile = true;
  c.profile_dir = TmpDir("pp2");
  c.profile_step_start = 1;  // steps 2 and 3
  c.profile_step_end = 3;
  c.eval_interval = 2;  // an evaluation inside the window
  c.eval_iters = 1;
  c.save = TmpDir("pp2_ckpt");
  c.save_interval = 2;  // a save inside the window
  c.tensorboard_dir = TmpDir("pp2_tb");
  c.log_timers_to_tensorboard = true;
  const testing::RunResult run = Lines(testing::Run(c, l));
  ASSERT_TRUE(run.status.ok()) << run.status;

  // Megatron's block after each log line, with every level-2 timer that ran.
  size_t header = run.log.size();
  for (size_t i = 0; i + 1 < run.log.size(); ++i) {
    if (run.log[i].find("iteration") != std::string::npos &&
        run.log[i + 1] == "(min, max) time across ranks (ms):") {
      header = i + 1;
      break;
    }
  }
  ASSERT_LT(header, run.log.size()) << "no timer block after a log line";
  const std::vector<std::string> names = TimerNamesAfter(run.log, header);
  EXPECT_EQ(std::find(names.begin(), names.end(), "params-all-gather"), names.end())
      << "no ZeRO-1: nothing gathered, no timer";
  for (const char* want : {"forward-backward", "optimizer", "grads-all-reduce",
                           "forward-compute", "backward-compute",
                           "batch-generator", "forward-send-backward-recv",
                           "backward-send-forward-recv"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  bool saved_timer = false;
  for (const std::string& line : run.log) {
    saved_timer |= line.rfind("    save-checkpoint ", 0) == 0;
  }
  EXPECT_TRUE(saved_timer) << "save-checkpoint is logged after a save (level 0)";

  // <timer>-time scalars at the log steps.
  auto files = checkpoint::ListDir(c.tensorboard_dir);
  ASSERT_TRUE(files.ok() && files->size() == 1u);
  auto scalars = tensorboard::ReadScalars(checkpoint::JoinPath(c.tensorboard_dir, (*files)[0]));
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  std::set<int64_t> fb_steps;
  for (const auto& s : *scalars) {
    if (s.tag == "forward-backward-time") {
      fb_steps.insert(s.step);
      EXPECT_GT(s.value, 0);
      EXPECT_LT(s.value, 60);  // seconds per iteration, not ms
    }
  }
  EXPECT_EQ(fb_steps, (std::set<int64_t>{2, 4}));

  // The merged trace: valid JSON, one process per rank.
  const std::string text = Read(c.profile_dir + "/trace.json");
  ASSERT_FALSE(text.empty());
  json j = json::parse(text);
  absl::StatusOr<profile::ParsedTrace> t = profile::ParseTrace(text, "trace.json");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->processes.size(), 2u);
  EXPECT_EQ(t->processes[0], (std::pair<int, std::string>{0, "rank 0"}));
  EXPECT_EQ(t->processes[1], (std::pair<int, std::string>{1, "rank 1"}));
  std::map<int, std::map<std::string, int>> count;  // pid -> name -> spans
  for (const profile::Event& e : t->events) {
    ++count[e.pid][e.name];
    EXPECT_GE(e.ts_us, 0) << e.name << ": before the window opened";
    EXPECT_GE(e.dur_us, 0) << e.name;
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(count[rank]["train-step"], 2) << rank;
    EXPECT_EQ(count[rank]["forward-backward"], 2) << rank;
    EXPECT_EQ(count[rank]["forward-compute"], 8) << rank << ": 4 micro-batches x 2 steps";
    EXPECT_EQ(count[rank]["backward-compute"], 8) << rank;
    EXPECT_EQ(count[rank]["optimizer"], 2) << rank;
    EXPECT_EQ(count[rank]["save-checkpoint"], 1) << rank;
    EXPECT_EQ(count[rank]["evaluate"], 1) << rank;
    EXPECT_GE(count[rank]["batch-generator"], 1) << rank;
  }
  // Per layer: 4 layers over 2 stages; the embedding on stage 0, the head on stage 1.
  for (const char* name : {"forward embedding", "forward layer 0", "forward layer 1",
                           "backward layer 0", "backward layer 1", "backward embedding"}) {
    EXPECT_EQ(count[0][name], 8) << name;
    EXPECT_EQ(count[1][name], 0) << name;
  }
  for (const char* name : {"forward layer 2", "forward layer 3", "forward output-layer",
                           "backward output-layer", "backward layer 3", "backward layer 2"}) {
    EXPECT_EQ(count[1][name], 8) << name;
    EXPECT_EQ(count[0][name], 0) << name;
  }
  EXPECT_GE(count[0]["forward-send"] + count[0]["forward-send-backward-recv"], 1);
  EXPECT_GE(count[1]["forward-recv"], 1);

  // Spans nest: every compute span inside its rank's forward-backward, and
  // every forward-backward inside a train-step.
  auto inside = [&](const profile::Event& e, const char* outer) {
    for (const profile::Event& o : t->events) {
      if (o.pid == e.pid && o.name == outer && o.ts_us <= e.ts_us &&
          e.ts_us + e.dur_us <= o.ts_us + o.dur_us + 1e-3) {
        return true;
      }
    }
    return false;
  };
  int p2p_with_bytes = 0, collectives_with_bytes = 0;
  for (const profile::Event& e : t->events) {
    if (e.name == "forward-compute" || e.name == "backward-compute") {
      EXPECT_TRUE(inside(e, "forward-backward")) << e.name << " at " << e.ts_us;
      json a = json::parse(e.args);
      EXPECT_TRUE(a.contains("micro_batch") && a.contains("chunk")) << e.args;
    }
    if (e.name == "forward-backward") {
      EXPECT_TRUE(inside(e, "train-step"));
    }
    if (e.name.rfind("forward layer", 0) == 0 || e.name == "forward embedding") {
      EXPECT_TRUE(inside(e, "forward-compute")) << e.name << " at " << e.ts_us;
    }
    if (e.name.rfind("backward layer", 0) == 0 || e.name == "backward output-layer") {
      EXPECT_TRUE(inside(e, "backward-compute")) << e.name << " at " << e.ts_us;
    }
    if (e.cat == "p2p" && e.name != "forward-recv" && e.name.find('-') == std::string::npos) {
      json a = json::parse(e.args);
      if (a.value("bytes", 0) > 0 && a.contains("group")) ++p2p_with_bytes;
    }
    if (e.cat == "comm" && e.track.rfind("comm ", 0) == 0) {
      json a = json::parse(e.args);
      EXPECT_GT(a["bytes"].get<int64_t>() + (e.name == "barrier" ? 1 : 0), 0) << e.args;
      EXPECT_TRUE(a.contains("ranks")) << e.args;
      ++collectives_with_bytes;
    }
  }
  EXPECT_GT(p2p_with_bytes, 0) << "pipeline sends/receives from comm's recorder";
  EXPECT_GT(collectives_with_bytes, 0) << "the loss broadcast, the norm, the embedding sum";
}

TEST(ProfileTest, TensorParallelRunRecordsTpCollectives) {
  const Layout l{2, 1, 1};
  TrainConfig c = testing::TinyConfig(l, 2);
  c.log_interval = 1;
  c.timing_log_level = 1;
  c.profile = true;
  c.profile_dir = TmpDir("tp2");
  c.profile_step_start = 1;
  c.profile_step_end = 2;
  const testing::RunResult run = Lines(testing::Run(c, l));
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::vector<std::string> names;
  for (size_t i = 0; i < run.log.size(); ++i) {
    if (run.log[i] == "(min, max) time across ranks (ms):") {
      names = TimerNamesAfter(run.log, i);
      break;
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"forward-backward", "optimizer", "grads-all-reduce"}))
      << "level 1: no per micro-batch timers (and no ZeRO-1: no params-all-gather)";
  absl::StatusOr<profile::ParsedTrace> t =
      profile::ParseTrace(Read(c.profile_dir + "/trace.json"), "trace.json");
  ASSERT_TRUE(t.ok()) << t.status();
  std::map<int, int> tp_all_reduces;
  for (const profile::Event& e : t->events) {
    if (e.name == "all_reduce" && e.track.rfind("comm tp", 0) == 0) {
      json a = json::parse(e.args);
      EXPECT_EQ(a["group"], "tp");
      EXPECT_EQ(a["ranks"], json::parse("[0,1]"));
      EXPECT_GT(a["bytes"].get<int64_t>(), 0);
      ++tp_all_reduces[e.pid];
    }
  }
  EXPECT_GT(tp_all_reduces[0], 0);
  EXPECT_EQ(tp_all_reduces[0], tp_all_reduces[1]) << "every TP all-reduce on both ranks";
  // The timers above the level are still spans while profiling.
  int forwards = 0;
  for (const profile::Event& e : t->events) forwards += e.name == "forward-compute";
  EXPECT_EQ(forwards, 2 * 4);
}

TEST(ProfileTest, DistributedOptimizerNamesWhatItRuns) {
  Layout l{1, 1, 2};
  l.distributed = true;  // ZeRO-1: reduce-scatter the gradients, all-gather the parameters
  TrainConfig c = testing::TinyConfig(l, 2);
  c.log_interval = 2;
  c.timing_log_level = 1;
  c.profile = true;
  c.profile_dir = TmpDir("zero1");
  c.profile_step_start = 1;
  c.profile_step_end = 2;
  const testing::RunResult run = Lines(testing::Run(c, l));
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::vector<std::string> names;
  for (size_t i = 0; i < run.log.size(); ++i) {
    if (run.log[i] == "(min, max) time across ranks (ms):") names = TimerNamesAfter(run.log, i);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"forward-backward", "optimizer",
                                             "grads-reduce-scatter", "params-all-gather"}));
  absl::StatusOr<profile::ParsedTrace> t =
      profile::ParseTrace(Read(c.profile_dir + "/trace.json"), "trace.json");
  ASSERT_TRUE(t.ok()) << t.status();
  std::map<std::string, int> dp_ops;
  for (const profile::Event& e : t->events) {
    if (e.track.rfind("comm dp", 0) == 0) {
      ++dp_ops[e.name];
      EXPECT_GT(json::parse(e.args)["bytes"].get<int64_t>(), 0) << e.args;
    }
  }
  EXPECT_GT(dp_ops["reduce_scatter"], 0);
  EXPECT_GT(dp_ops["all_gather"], 0);
  EXPECT_EQ(dp_ops["reduce_scatter"], dp_ops["all_gather"]) << "one of each per bucket";
}

}  // namespace
}  // namespace loom::train
