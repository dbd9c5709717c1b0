// bazel run //train:plan_bench -- [--hardware=plan/testdata/cpu.textproto]
// The time model against Loom on this machine: small GPTs trained for a few
// steps in several layouts (ranks as threads, local backend); the measured
// step time (median over the steps after the first, from the trainer's own
// tokens/s) next to the planner's prediction with the same finalized config.
// A bench, not a test: it times things (shared machines are noisy).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "core/bench_util/bench_util.h"
#include "core/enum_names.h"
#include "plan/hardware.h"
#include "plan/layout.h"
#include "plan/time_model.h"
#include "train/test_util.h"

namespace {

using loom::train::testing::Layout;

}  // namespace

int main(int argc, char** argv) {
  std::string hw_path = "plan/testdata/cpu.textproto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--hardware=", 0) == 0) hw_path = a.substr(11);
  }
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY"); ws && hw_path[0] != '/') {
    hw_path = std::string(ws) + "/" + hw_path;
  }
  if (std::getenv("TEST_TMPDIR") == nullptr) setenv("TEST_TMPDIR", "/tmp", 1);
  absl::StatusOr<loom::plan::Hardware> hw = loom::plan::LoadHardware(hw_path);
  if (!hw.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(hw.status().message()).c_str());
    return 2;
  }
  struct Case {
    Layout layout;
    std::string recompute;
    bool tp_comm_overlap = false;
  };
  auto schedule = [](const char* kind) {
    Layout l{1, 2, 1};
    l.schedule = kind;
    return l;
  };
  std::vector<Case> cases = {{Layout{1, 1, 1}, ""},         {Layout{2, 1, 1}, ""},
                             {Layout{2, 1, 1, 0, true}, ""}, {Layout{1, 2, 1}, ""},
                             {Layout{1, 1, 2}, ""},          {Layout{1, 1, 2, 0, false, true}, ""},
                             {Layout{1, 1, 1}, "full"},
                             // #39: the zero-bubble schedules and the TP ring.
                             {schedule("zb-h1"), ""},        {schedule("zbv"), ""},
                             {schedule("dualpipev"), ""},    {Layout{2, 1, 1, 0, true}, "", true}};
  std::printf("| layout | measured s/step | predicted s/step (compute, comm, bubble) | error |\n"
              "|---|---|---|---|\n");
  for (const Case& k : cases) {
    loom::train::TrainConfig c = loom::train::testing::TinyConfig(k.layout, 12);  // a median of 11 steps: one slow step on a shared machine is not the figure
    c.model.num_layers = 4;
    c.model.hidden_size = 256;
    c.model.num_attention_heads = 4;
    c.model.seq_length = 128;
    c.micro_batch_size = 2;
    c.global_batch_size = 16;
    c.hidden_dropout = 0;
    c.log_interval = 1;
    c.optimizer.bucket_bytes = 4 << 20;
    c.model.recompute_granularity =
        loom::core::FindEnum<loom::layers::RecomputeGranularity>(k.recompute).value();
    if (k.recompute == "full") {
      c.model.recompute_method = loom::layers::RecomputeMethod::kUniform;
      c.model.recompute_num_layers = 1;
    }
    c.tp_comm_overlap = k.tp_comm_overlap;
    c.metrics_file = std::string(std::getenv("TEST_TMPDIR")) + "/plan_bench.jsonl";
    std::remove(c.metrics_file.c_str());
    loom::train::TrainConfig finalized;
    std::mutex mu;
    auto run = loom::train::testing::Run(c, k.layout, nullptr,
                                         [&](int rank, loom::train::Trainer& t) {
                                           std::lock_guard<std::mutex> lock(mu);
                                           if (rank == 0) finalized = t.config();
                                         });
    if (!run.status.ok()) {
      std::fprintf(stderr, "bench: %s: %s\n", k.layout.Describe().c_str(),
                   std::string(run.status.message()).c_str());
      return 1;
    }
    std::ifstream in(c.metrics_file);
    std::string line;
    std::vector<double> steps;
    int n = 0;
    const double tokens = static_cast<double>(c.global_batch_size) * c.model.seq_length;
    while (std::getline(in, line)) {
      const size_t at = line.find("\"tokens_per_s\": ");
      if (at == std::string::npos || n++ == 0) continue;  // the first step warms up
      steps.push_back(tokens / std::atof(line.c_str() + at + 16));
    }
    const double measured = loom::core::bench::Median(steps);
    loom::plan::TimeOptions time;
    time.tp_comm_overlap = finalized.tp_comm_overlap;
    absl::StatusOr<loom::plan::StepTime> p = loom::plan::PredictStepTime(finalized, *hw, time);
    if (!p.ok()) {
      std::fprintf(stderr, "bench: %s\n", std::string(p.status().message()).c_str());
      return 1;
    }
    std::printf("| %s%s | %.4f | %.4f (%.4f, %.4f, %.4f) | %+.0f%% |\n",
                (loom::plan::DescribeLayout(finalized) + " " +
                 std::string(loom::core::EnumName(finalized.pipeline_schedule)))
                    .c_str(),
                finalized.tp_comm_overlap ? " --tp-comm-overlap" : "", measured, p->step, p->compute,
                p->exposed_comm, p->bubble, 100 * (p->step / measured - 1));
    std::fflush(stdout);
  }
  return 0;
}
