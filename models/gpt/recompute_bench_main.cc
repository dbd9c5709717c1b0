// bazel run //models/gpt:recompute_bench -- [--num_layers=24 --hidden_size=1024 ...]
//
// Activation recomputation at GPT-2-medium shape (24 layers, hidden 1024, 16
// heads, seq 1024, vocab 50257, micro-batch 1; hidden and attention dropout
// 0.1), one rank: for none, selective and full (uniform, 1 layer a group:
// every layer's input kept), in one run, the activation bytes kept between
// the forward and the backward, the peak activation bytes of a training step
// (forward + backward; the rank's memory ledger, core/memory_stats.h), and
// the step time (median; forward + backward, no optimizer step). Prints a
// Markdown table with the predicted figures next to the measured ones.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/bench_util/bench_util.h"
#include "core/enum_names.h"
#include "core/memory_stats.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

ABSL_FLAG(int64_t, num_layers, 24, "Layers");
ABSL_FLAG(int64_t, hidden_size, 1024, "Hidden size");
ABSL_FLAG(int64_t, num_attention_heads, 16, "Heads");
ABSL_FLAG(int64_t, vocab_size, 50257, "Vocabulary");
ABSL_FLAG(int64_t, seq_length, 1024, "Sequence length");
ABSL_FLAG(int64_t, micro_batch_size, 1, "Micro-batch size");
ABSL_FLAG(int, iters, 2, "Timed steps per setting (after one warm-up step)");
ABSL_FLAG(std::string, settings, "none,selective,full",
          "Comma-separated: none | selective | full (uniform, 1) | full-block-N | full-uniform-N");

namespace {

using loom::core::MemoryCategory;
using loom::core::Tensor;
using loom::layers::GptConfig;
using loom::layers::GptModel;

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// "none", "selective", "full" (= full-uniform-1), "full-uniform-N", "full-block-N".
bool Apply(const std::string& s, GptConfig* c) {
  if (s == "none") return true;
  if (s == "selective") {
    c->recompute_granularity = loom::layers::RecomputeGranularity::kSelective;
    return true;
  }
  c->recompute_granularity = loom::layers::RecomputeGranularity::kFull;
  c->recompute_method = loom::layers::RecomputeMethod::kUniform;
  c->recompute_num_layers = 1;
  if (s == "full") return true;
  for (const char* method : {"uniform", "block"}) {
    const std::string prefix = std::string("full-") + method + "-";
    if (s.rfind(prefix, 0) == 0) {
      c->recompute_method = loom::core::FindEnum<loom::layers::RecomputeMethod>(method).value();
      c->recompute_num_layers = std::stoll(s.substr(prefix.size()));
      return true;
    }
  }
  return false;
}

struct Row {
  std::string name;
  int64_t kept = 0, peak = 0;
  double ms = 0;
  double loss = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  GptConfig base;
  base.num_layers = absl::GetFlag(FLAGS_num_layers);
  base.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  base.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  base.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  base.seq_length = absl::GetFlag(FLAGS_seq_length);
  const int64_t b = absl::GetFlag(FLAGS_micro_batch_size);
  const int64_t s = base.seq_length, h = base.hidden_size, a = base.num_attention_heads;
  const int64_t L = base.num_layers;
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));

  std::vector<std::string> names;
  for (std::string rest = absl::GetFlag(FLAGS_settings); !rest.empty();) {
    const size_t comma = rest.find(',');
    names.push_back(rest.substr(0, comma));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  std::printf("GPT: %lld layers, hidden %lld, %lld heads, seq %lld, vocab %lld, micro-batch %lld, "
              "f32, one rank, %s\n",
              (long long)L, (long long)h, (long long)a, (long long)s, (long long)base.vocab_size,
              (long long)b, loom::core::bench::CpuModel("unknown CPU").c_str());
  std::fflush(stdout);

  Tensor ids = loom::layers::testing::RandomIds(s, b, base.vocab_size, 1);
  Tensor targets = loom::layers::testing::RandomIds(s, b, base.vocab_size, 2);
  // Every setting's model exists at once and the timed steps take turns
  // (none, selective, full, none, ...), so a busy machine slows them alike.
  std::vector<Row> rows;
  std::vector<std::unique_ptr<GptModel>> models;
  for (const std::string& name : names) {
    GptConfig c = base;
    if (!Apply(name, &c)) {
      std::fprintf(stderr, "recompute_bench: unknown setting %s\n", name.c_str());
      return 2;
    }
    auto model = GptModel::Create(c, loom::layers::TpGroup{});
    if (!model.ok()) {
      std::fprintf(stderr, "recompute_bench: %s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    models.push_back(std::move(*model));
    rows.push_back(Row{name});
  }
  std::vector<std::vector<double>> ms(names.size());
  for (int i = 0; i <= iters; ++i) {  // step 0: warm-up (pages the buffers in)
    for (size_t k = 0; k < names.size(); ++k) {
      GptModel& model = *models[k];
      Row& row = rows[k];
      auto ledger = std::make_shared<loom::core::MemoryLedger>();
      loom::core::LedgerScope use(ledger);
      loom::core::MemoryScope tag(MemoryCategory::kActivations);
      loom::layers::DropoutStream d;
      d.hidden_p = d.attention_p = 0.1f;
      d.seed = 1234;
      d.stream = static_cast<uint64_t>(i);
      if (!model.params().ZeroGrads().ok()) return 1;
      const auto t0 = std::chrono::steady_clock::now();
      auto saved = std::make_unique<GptModel::Saved>();
      double loss = 0;
      absl::Status f = model.Forward(0, ids, targets, d, saved.get(), &loss).status();
      const int64_t kept = ledger->Stats().current_of(MemoryCategory::kActivations);
      absl::Status bw = f.ok() ? model.Backward(0, Tensor(), 1.0f, d, *saved).status() : f;
      if (!bw.ok()) {
        std::fprintf(stderr, "recompute_bench: %s\n", std::string(bw.message()).c_str());
        return 1;
      }
      saved.reset();
      const double elapsed = loom::core::bench::MillisecondsSince(t0);
      std::printf("  step %d %s: %.1f ms, kept %.1f MiB, peak %.1f MiB, loss %.9f\n", i,
                  row.name.c_str(), elapsed, MiB(kept),
                  MiB(ledger->Stats().peak_of(MemoryCategory::kActivations)), loss);
      std::fflush(stdout);
      if (i == 0) {
        row.loss = loss;
        continue;
      }
      ms[k].push_back(elapsed);
      row.kept = kept;
      row.peak = std::max(row.peak, ledger->Stats().peak_of(MemoryCategory::kActivations));
    }
  }
  for (size_t k = 0; k < names.size(); ++k) rows[k].ms = loom::core::bench::Median(ms[k]);

  // The formulas (models/gpt/recompute_memory_test.cc): a layer keeps 16 hidden
  // states' worth (15 + its output), 4 LayerNorm vectors and the attention
  // kernel's log-sum-exp (the flash kernel keeps no s x s probabilities; its
  // output is the projection's saved input); full keeps one hidden state a layer.
  const int64_t X = s * b * h * 4, P = b * a * s * 4;
  const int64_t layer = 16 * X + 4 * s * b * 4 + P;
  std::printf("\nPer layer, predicted: %.2f MiB kept without recomputation, of which %.3f MiB "
              "attention log-sum-exp (selective drops it); full keeps %.2f MiB (its input).\n\n",
              MiB(layer), MiB(P), MiB(X));
  std::printf("| recomputation | kept after forward | change vs none | peak activations (step) | "
              "step time (fwd+bwd, median of %d) | vs none |\n|---|---|---|---|---|---|\n",
              iters);
  const Row* none = nullptr;
  for (const Row& r : rows) {
    if (r.name == "none") none = &r;
  }
  for (const Row& r : rows) {
    GptConfig c = base;
    Apply(r.name, &c);
    int64_t predicted = 0;  // change of the kept bytes vs none
    if (c.recompute_selective()) predicted = -L * P;
    if (c.recompute_full()) {
      for (const loom::layers::BlockRun& run : loom::layers::RecomputePlan(c, L)) {
        if (run.recompute) predicted -= run.count * (layer - X) + (run.count - 1) * X;
      }
    }
    char change[96] = "-", ratio[32] = "-";
    if (none != nullptr && &r != none) {
      std::snprintf(change, sizeof(change), "%+.2f MiB (predicted %+.2f MiB)",
                    MiB(r.kept - none->kept), MiB(predicted));
    }
    if (none != nullptr) std::snprintf(ratio, sizeof(ratio), "%.2fx", r.ms / none->ms);
    std::printf("| %s | %.1f MiB | %s | %.1f MiB | %.0f ms | %s |\n", r.name.c_str(), MiB(r.kept),
                change, MiB(r.peak), r.ms, ratio);
  }
  return 0;
}
