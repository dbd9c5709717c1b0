// bazel run //train:bench -- [--iters=5] [--num-layers=12 ...]
//
// Training-step speed of a GPT-2-small-shaped model (12 layers, hidden 768,
// 12 heads, vocab 50257, seq 64, micro-batch 4) on one process: ms/step,
// tokens/s, and the achieved model FLOP/s as a fraction of the GEMM rate
// measured in the same run (1024³ f32 GEMM through the same oneDNN path).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/cli.h"
#include "layers/gpt_model.h"
#include "layers/test_util.h"
#include "train/metrics.h"
#include "train/optimizer.h"

ABSL_FLAG(int64_t, num_layers, 12, "Layers");
ABSL_FLAG(int64_t, hidden_size, 768, "Hidden size");
ABSL_FLAG(int64_t, num_attention_heads, 12, "Heads");
ABSL_FLAG(int64_t, vocab_size, 50257, "Vocabulary");
ABSL_FLAG(int64_t, seq_length, 64, "Sequence length");
ABSL_FLAG(int64_t, micro_batch_size, 4, "Micro-batch size");
ABSL_FLAG(int, iters, 5, "Timed steps (after one warm-up step)");

int main(int argc, char** argv) {
  loom::core::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  using loom::core::Tensor;
  loom::layers::GptConfig c;
  c.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  const int64_t b = absl::GetFlag(FLAGS_micro_batch_size);
  auto model = loom::layers::GptModel::Create(c, loom::layers::TpGroup{});
  if (!model.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  auto opt = loom::train::Optimizer::Create(&(*model)->params(), {}, {});
  if (!opt.ok()) return 1;
  Tensor ids = loom::layers::testing::RandomIds(c.seq_length, b, c.vocab_size, 1);
  Tensor targets = loom::layers::testing::RandomIds(c.seq_length, b, c.vocab_size, 2);
  loom::layers::DropoutStream dropout;
  dropout.hidden_p = 0.1f;

  auto step = [&](int i) -> double {
    if (!(*model)->params().ZeroGrads().ok()) std::abort();
    dropout.stream = i;
    loom::layers::GptModel::Saved saved;
    double loss = 0;
    if (!(*model)->Forward(0, ids, targets, dropout, &saved, &loss).ok()) std::abort();
    if (!(*model)->Backward(0, Tensor(), 1.0f, dropout, saved).ok()) std::abort();
    if (!(*opt)->ReduceGradients().ok() || !(*opt)->Step(1e-4f).ok()) std::abort();
    return loss;
  };
  step(0);  // warm-up: page in the buffers
  const int iters = absl::GetFlag(FLAGS_iters);
  std::vector<double> ms;
  for (int i = 1; i <= iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step(i);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double gemm = loom::train::MeasureGemmFlops();  // same process, same threads, now
  const double tokens = static_cast<double>(c.seq_length * b);
  const double achieved = loom::train::ModelFlopsPerToken(c) * tokens / (med / 1e3);
  std::printf("GPT: %lld layers, hidden %lld, heads %lld, vocab %lld, seq %lld, micro-batch %lld: "
              "%.1fM parameters, %.2f GFLOP per step\n",
              (long long)c.num_layers, (long long)c.hidden_size, (long long)c.num_attention_heads,
              (long long)c.vocab_size, (long long)c.seq_length, (long long)b,
              loom::layers::ParameterCount(c) / 1e6,
              loom::train::ModelFlopsPerToken(c) * tokens / 1e9);
  std::printf("| metric | value |\n|---|---|\n");
  std::printf("| ms/step (median of %d) | %.1f |\n", iters, med);
  std::printf("| tokens/s | %.0f |\n", tokens / (med / 1e3));
  std::printf("| model GFLOP/s | %.1f |\n", achieved / 1e9);
  std::printf("| GEMM GFLOP/s (1024^3, same run) | %.1f |\n", gemm / 1e9);
  std::printf("| model / GEMM | %.2f |\n", achieved / gemm);
  return 0;
}
