// bazel run //tests:zero3_memory_bench: issue #37's memory proof for ZeRO-3
// at GPT-2-medium's parameter shape (24 layers, hidden 1024, 16 heads,
// vocabulary 50257, 1024 positions) on 8 data-parallel ranks as threads
// (local backend), one training step on mock data (sequences of 64 tokens:
// the parameters, not the activations, are what this measures). Per rank:
// the ledger's peak parameter + gradient + optimizer bytes under
// optim_grads_params against 1/8 of no_shard's (the planner's, whose
// parameter, gradient and optimizer terms //tests:plan_memory_model_test
// checks exact) plus the largest unit's gather buffer, and the planner's
// prediction of the same ZeRO-3 figures. A bench, not a test: it allocates
// about 10 GiB and runs for minutes on two cores.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "core/memory_stats.h"
#include "plan/memory_model.h"
#include "train/test_util.h"

namespace loom {
namespace {

using core::MemoryCategory;

// A GPT-2-sized vocabulary (50257 entries: the 256 byte symbols of GPT-2's
// byte-to-unicode map, 50000 placeholder tokens and <|endoftext|>; no merges:
// mock data never encodes text), written to `dir`.
void WriteVocabulary(const std::string& dir) {
  auto utf8 = [](int cp) {
    std::string out;
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return out;
  };
  std::ofstream vocab(dir + "/vocab.json");
  vocab << "{";
  int extra = 0, id = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : 256 + extra++;
    std::string symbol = utf8(cp);
    if (symbol == "\"" || symbol == "\\") symbol = "\\" + symbol;
    vocab << (id ? "," : "") << "\"" << symbol << "\":" << id;
    ++id;
  }
  for (int k = 0; k < 50000; ++k) vocab << ",\"tok" << k << "\":" << id++;
  vocab << ",\"<|endoftext|>\":" << id << "}";
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\n";
}

int Main() {
  constexpr int kDp = 8;
  train::testing::Layout l = train::testing::OptimGradsParams({1, 1, kDp});
  train::TrainConfig c = train::testing::TinyConfig(l, 1);
  c.model.num_layers = 24;
  c.model.hidden_size = 1024;
  c.model.num_attention_heads = 16;
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  WriteVocabulary(dir);
  c.tokenizer_type = loom::train::TokenizerType::kGpt2Bpe;
  c.vocab_file = dir + "/vocab.json";
  c.merge_file = dir + "/merges.txt";
  c.model.make_vocab_size_divisible_by = 128;
  c.model.max_position_embeddings = 1024;
  c.model.seq_length = 64;
  c.mock_data = true;
  c.data_path.clear();
  c.micro_batch_size = 1;
  c.global_batch_size = kDp;
  c.optimizer.bucket_bytes = 40000000;  // Megatron's default --ddp-bucket-size
  c.lr.warmup_iters = 0;
  struct Rank {
    core::MemoryStats stats;
    int64_t largest_unit = 0, gathered_peak = 0;
  };
  std::vector<Rank> ranks(kDp);
  train::TrainConfig finalized;
  std::mutex mu;
  train::testing::RunResult run =
      train::testing::Run(c, l, nullptr, [&](int rank, train::Trainer& t) {
        const distributed::GradientSync& g = t.gradients();
        int64_t largest = 0;
        for (const std::vector<size_t>& unit : g.unit_buckets()) {
          int64_t bytes = 0;
          for (size_t b : unit) bytes += 4 * (g.buckets()[b].range.second - g.buckets()[b].range.first);
          largest = std::max(largest, bytes);
        }
        std::lock_guard<std::mutex> lock(mu);
        ranks[rank] = {t.RankMemory(), largest, g.peak_gathered_bytes()};
        if (rank == 0) finalized = t.config();
      });
  if (!run.status.ok()) {
    std::fprintf(stderr, "zero3_memory_bench: %s\n", run.status.ToString().c_str());
    return 1;
  }
  const plan::MemoryBreakdown zero3 = plan::PredictMemory(finalized)[0].bytes;
  train::TrainConfig plain = finalized;
  plain.optimizer.distributed = plain.optimizer.shard_gradients = plain.optimizer.shard_params =
      false;
  plain.overlap_param_gather = false;
  const plan::MemoryBreakdown zero0 = plan::PredictMemory(plain)[0].bytes;
  const double mib = 1 << 20;
  const double zero0_pgo = zero0.parameters + zero0.gradients + zero0.optimizer;
  const double predicted = zero3.parameters + zero3.gradients + zero3.optimizer;
  std::printf("GPT-2-medium shape (vocabulary %lld, %lld parameter elements per rank, padded), "
              "DP %d, ZeRO-3:\n",
              static_cast<long long>(finalized.model.vocab_size),
              static_cast<long long>(plan::StageParameters(finalized, 0)), kDp);
  std::printf("| rank | params | grads | optim | P+G+O measured | predicted | error | ZeRO-0 P+G+O "
              "/ 8 | largest unit's gather | bound (+ 8 B) | gathered peak (comm) | within |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool ok = true;
  for (int r = 0; r < kDp; ++r) {
    const core::MemoryStats& s = ranks[r].stats;
    const double p = static_cast<double>(s.peak_of(MemoryCategory::kParameters));
    const double g = static_cast<double>(s.peak_of(MemoryCategory::kGradients));
    const double o = static_cast<double>(s.peak_of(MemoryCategory::kOptimizer));
    const double measured = p + g + o;
    // + 8 B: the f64 scalar the sharded gradient norm is all-reduced in
    // (the optimizer's; no_shard at DP alone has no partial norm to sum).
    const double bound = zero0_pgo / kDp + static_cast<double>(ranks[r].largest_unit) + 8;
    const double error = predicted / measured - 1;
    const bool within = measured <= bound && std::abs(error) <= 0.10;
    ok &= within;
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f MiB | %.1f MiB | %+.2f%% | %.1f MiB | %.1f MiB | "
                "%.1f MiB | %.1f MiB | %s |\n",
                r, p / mib, g / mib, o / mib, measured / mib, predicted / mib, 100 * error,
                zero0_pgo / kDp / mib, ranks[r].largest_unit / mib, bound / mib,
                ranks[r].gathered_peak / mib, within ? "yes" : "NO");
  }
  std::printf("rank 0: measured - bound (incl. the norm's 8 B) = %.0f B (params %lld, grads %lld, optim %lld B)\n",
              static_cast<double>(ranks[0].stats.peak_of(MemoryCategory::kParameters) +
                                  ranks[0].stats.peak_of(MemoryCategory::kGradients) +
                                  ranks[0].stats.peak_of(MemoryCategory::kOptimizer)) -
                  (zero0_pgo / kDp + static_cast<double>(ranks[0].largest_unit) + 8),
              static_cast<long long>(ranks[0].stats.peak_of(MemoryCategory::kParameters)),
              static_cast<long long>(ranks[0].stats.peak_of(MemoryCategory::kGradients)),
              static_cast<long long>(ranks[0].stats.peak_of(MemoryCategory::kOptimizer)));
  std::printf("ZeRO-0 per rank (planner, exact terms): params %.1f + grads %.1f + optim %.1f MiB\n",
              zero0.parameters / mib, zero0.gradients / mib, zero0.optimizer / mib);
  return ok ? 0 : 2;
}

}  // namespace
}  // namespace loom

int main() { return loom::Main(); }
