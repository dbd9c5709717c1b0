// bazel run //train:plan_bench -- [--hardware=plan/testdata/cpu.textproto | --calibrate] [--rows=N]
// The time model against Loom on this machine: small GPTs trained for a few
// steps in several layouts (ranks as threads, local backend); the measured
// step time (median over the steps after the first, from the trainer's own
// tokens/s) next to the planner's prediction with the same finalized config.
// --calibrate: the hardware file is measured in this run, again right before
// each layout trains (plan::Calibrate, what `//train:plan -- --calibrate`
// prints; a few seconds), so each prediction and its steps see about the
// same load from other processes; the first file is printed in full, and
// each row's GEMM, element-wise and attention rates in its last column.
// The one-rank row is also split by kind of kernel (every core/ops kernel
// timed, core/ops/kernel_timer.h) next to the model's terms (StepTime::terms).
// A bench, not a test: it times things (shared machines are noisy).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/bench_util/bench_util.h"
#include "core/enum_names.h"
#include "core/ops/kernel_timer.h"
#include "plan/calibrate.h"
#include "plan/hardware.h"
#include "plan/layout.h"
#include "plan/time_model.h"
#include "absl/strings/str_format.h"
#include "train/test_util.h"

namespace {

using loom::train::testing::Layout;

// The model's term (plan::ComputeTerms) a core/ops kernel belongs to.
std::string TermOf(const std::string& kernel) {
  auto starts = [&](const char* p) { return kernel.rfind(p, 0) == 0; };
  if (kernel == "matmul" || kernel == "batched_matmul" || starts("linear_")) return "gemm";
  if (starts("flash_") || starts("attention_") || starts("softmax_") || starts("qkv_split_rope")) {
    return "attention";
  }
  if (starts("cross_entropy") || starts("vocab_shard")) return "loss";
  if (starts("embedding_")) return "embedding";
  if (starts("adamw_") || starts("sum_squares")) return "optimizer";
  if (starts("layernorm_") || starts("rmsnorm_") || starts("residual_norm") || starts("gelu_") ||
      starts("bias_add") || starts("dropout_") || starts("swiglu_") || starts("rope_") ||
      kernel == "add" || kernel == "scale") {
    return "elementwise";
  }
  return "other";  // zero (allocation), convert, sum, synchronize, MoE routing
}

// Measured kernel seconds per step by term next to the model's, and what no
// kernel accounts for (the step minus every kernel).
void PrintBreakdown(const std::vector<loom::core::ops::KernelTime>& totals, int steps,
                    double step_s, const loom::plan::StepTime& p) {
  std::map<std::string, double> measured, flops;
  std::map<std::string, std::string> kernels;
  double in_kernels = 0;
  for (const auto& k : totals) {
    const std::string term = TermOf(k.kernel);
    measured[term] += k.seconds / steps;
    flops[term] += k.flops / steps;
    in_kernels += k.seconds / steps;
    if (k.seconds / steps >= 1e-4) {
      absl::StrAppendFormat(&kernels[term], "%s%s %.1f", kernels[term].empty() ? "" : ", ",
                            k.kernel, 1e3 * k.seconds / steps);
    }
  }
  const loom::plan::ComputeTerms& t = p.terms;
  std::printf("\nOne rank, by kind of kernel (%d steps, each kernel timed), s/step:\n\n"
              "| term | measured | predicted | predicted/measured | kernels (ms/step) |\n"
              "|---|---|---|---|---|\n", steps);
  for (const auto& [term, predicted] : std::vector<std::pair<std::string, double>>{
           {"gemm", t.gemm}, {"attention", t.attention}, {"elementwise", t.elementwise},
           {"loss", t.loss}, {"embedding", t.embedding}, {"optimizer", t.optimizer},
           {"other", 0.0}}) {
    const double m = measured[term];
    std::printf("| %s | %.4f | %.4f | %s | %s%s |\n", term.c_str(), m, predicted,
                m > 0 ? absl::StrFormat("%.2f", predicted / m).c_str() : "-", kernels[term].c_str(),
                flops[term] > 0 && m > 0
                    ? absl::StrFormat(" (%.1f GFLOP/s)", flops[term] / m / 1e9).c_str()
                    : "");
  }
  std::printf("| outside any kernel | %.4f | 0 | - | layers, allocation, gaps |\n",
              step_s - in_kernels);
  std::printf("| step | %.4f | %.4f | %.2f | |\n\n", step_s, p.step, p.step / step_s);
}

// The 1-minute load average (other processes share the cores), or -1.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

}  // namespace

int main(int argc, char** argv) {
  std::string hw_path = "plan/testdata/cpu.textproto";
  bool calibrate = false;
  size_t rows = 0;  // 0: every row
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--hardware=", 0) == 0) {
      hw_path = a.substr(11);
    } else if (a == "--calibrate") {
      calibrate = true;
    } else if (a.rfind("--rows=", 0) == 0 && std::atoi(a.c_str() + 7) > 0) {
      rows = static_cast<size_t>(std::atoi(a.c_str() + 7));
    } else {
      std::fprintf(stderr,
                   "bench: unknown argument '%s' (expected --hardware=FILE, --calibrate or "
                   "--rows=N, N > 0: the first N layouts)\n",
                   a.c_str());
      return 2;
    }
  }
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY"); ws && hw_path[0] != '/') {
    hw_path = std::string(ws) + "/" + hw_path;
  }
  if (std::getenv("TEST_TMPDIR") == nullptr) setenv("TEST_TMPDIR", "/tmp", 1);
  auto measure = [](bool print) -> absl::StatusOr<loom::plan::Hardware> {
    absl::StatusOr<std::string> text = loom::plan::Calibrate();
    if (!text.ok()) return text.status();
    if (print) std::printf("%s\n", text->c_str());
    return loom::plan::ParseHardware(*text, "--calibrate");
  };
  absl::StatusOr<loom::plan::Hardware> hw = calibrate ? measure(true) : loom::plan::LoadHardware(hw_path);
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
  struct Breakdown {
    std::vector<loom::core::ops::KernelTime> totals;
    int steps;
    double step_s;  // wall time per step between the first and last log lines
    loom::plan::StepTime predicted;
  };
  std::vector<Breakdown> breakdowns;
  std::printf("| layout | measured s/step | predicted s/step (compute, comm, bubble) | error | load |%s\n"
              "|---|---|---|---|---|%s\n",
              calibrate ? " calibration: GEMM GFLOP/s at 1e8 FLOPs, element-wise GB/s, attention "
                          "GFLOP/s at 1.7e7 |"
                        : "",
              calibrate ? "---|" : "");
  bool first = true;
  if (rows > 0 && rows < cases.size()) cases.resize(rows);
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
    if (calibrate && !first) hw = measure(false);
    first = false;
    if (!hw.ok()) {
      std::fprintf(stderr, "bench: --calibrate: %s\n", std::string(hw.status().message()).c_str());
      return 1;
    }
    loom::train::TrainConfig finalized;
    std::mutex mu;
    // The one-rank row: every kernel timed from the end of the first step
    // (its log line) to the end of the last; one rank, so one thread runs them.
    const bool breakdown = k.layout.world() == 1 && k.recompute.empty();
    std::unique_ptr<loom::core::ops::KernelTimer> timer;
    if (breakdown) {
      auto started = loom::core::ops::KernelTimer::Start();
      if (!started.ok()) {
        std::fprintf(stderr, "bench: %s\n", std::string(started.status().message()).c_str());
        return 1;
      }
      timer = std::move(*started);
    }
    std::vector<std::chrono::steady_clock::time_point> logged;
    auto run = loom::train::testing::Run(
        c, k.layout, nullptr,
        [&](int rank, loom::train::Trainer& t) {
          std::lock_guard<std::mutex> lock(mu);
          if (rank == 0) finalized = t.config();
        },
        [&](const std::string& line) {
          if (line.find(" iteration ") != 0 || line.find("tokens/s") == std::string::npos) return;
          logged.push_back(std::chrono::steady_clock::now());
          if (timer != nullptr && logged.size() == 1) timer->Reset();
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
    if (timer != nullptr) {
      breakdowns.push_back({timer->Totals(), static_cast<int>(logged.size()) - 1,
                            std::chrono::duration<double>(logged.back() - logged.front()).count() /
                                std::max<size_t>(1, logged.size() - 1),
                            *p});
      timer.reset();
    }
    std::string rates;
    if (calibrate) {
      rates = absl::StrFormat(
          " %.1f, %.1f, %.1f |",
          hw->peak_flops() * loom::plan::GemmEfficiency(*hw, 1e8) / 1e9,
          1.0 / loom::plan::ElementwiseSeconds(*hw, 1e9), 1.67772e7 / loom::plan::AttentionSeconds(*hw, 1.67772e7) / 1e9);
    }
    std::printf("| %s%s | %.4f | %.4f (%.4f, %.4f, %.4f) | %+.0f%% | %.1f |%s\n",
                (loom::plan::DescribeLayout(finalized) + " " +
                 std::string(loom::core::EnumName(finalized.pipeline_schedule)))
                    .c_str(),
                finalized.tp_comm_overlap ? " --tp-comm-overlap" : "", measured, p->step, p->compute,
                p->exposed_comm, p->bubble, 100 * (p->step / measured - 1), LoadAverage(),
                rates.c_str());
    std::fflush(stdout);
  }
  for (const Breakdown& b : breakdowns) PrintBreakdown(b.totals, b.steps, b.step_s, b.predicted);
  return 0;
}
