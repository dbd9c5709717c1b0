// bazel run //train:bench -- [--iters=5] [--num-layers=12 ...] [--device=cuda --bf16]
//
// Training-step speed of a GPT-2-small-shaped model (12 layers, hidden 768,
// 12 heads, vocab 50257, seq 64, micro-batch 4) on one process: ms/step,
// tokens/s, and the achieved model FLOP/s as a fraction of the GEMM rate
// measured in the same run through the same kernel path: a 1024³ f32 GEMM
// (oneDNN) on the CPU, a 4096³ GEMM in the compute dtype (cuBLAS) on a GPU;
// then where a step's time goes (zeroing, forward, backward, optimizer) and
// kernel by kernel (--kernel_breakdown; on a GPU by CUDA events): the GEMMs'
// own rate and the best ratio this step could reach if everything else took
// no time.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "config/config.h"
#include "core/bench_util/bench_util.h"
#include "core/cli.h"
#include "core/ops/kernel_timer.h"
#include "core/ops/ops.h"
#include "core/storage.h"
#include "layers/test_util.h"
#include "models/gpt/gpt_model.h"
#include "train/device_setup.h"
#include "train/metrics.h"
#include "train/optimizer.h"

ABSL_FLAG(int64_t, num_layers, 12, "Layers");
ABSL_FLAG(int64_t, hidden_size, 768, "Hidden size");
ABSL_FLAG(int64_t, num_attention_heads, 12, "Heads");
ABSL_FLAG(int64_t, vocab_size, 50257, "Vocabulary");
ABSL_FLAG(int64_t, seq_length, 64, "Sequence length");
ABSL_FLAG(int64_t, micro_batch_size, 4, "Micro-batch size");
ABSL_FLAG(int64_t, ffn_hidden_size, 0, "MLP width (0: 4 x hidden)");
// The Llama family's architecture (Megatron's names, as //train:gpt takes them).
ABSL_FLAG(bool, group_query_attention, false, "grouped-query attention (with --num-query-groups)");
ABSL_FLAG(int64_t, num_query_groups, 1, "K/V heads with --group-query-attention");
ABSL_FLAG(loom::layers::Normalization, normalization, loom::layers::Normalization::kLayerNorm,
          "LayerNorm | RMSNorm");
ABSL_FLAG(loom::layers::PositionEmbedding, position_embedding_type,
          loom::layers::PositionEmbedding::kLearnedAbsolute, "learned_absolute | rope");
ABSL_FLAG(bool, swiglu, false, "SwiGLU MLP (silu(gate) * up)");
ABSL_FLAG(bool, disable_bias_linear, false, "no biases in the linear layers");
ABSL_FLAG(bool, untie_embeddings_and_output_weights, false, "an output layer of its own");
ABSL_FLAG(int, iters, 5, "Timed steps (after one warm-up step)");
ABSL_FLAG(loom::train::DeviceKind, device, loom::train::DeviceKind::kCpu, "cpu | cuda");
ABSL_FLAG(bool, bf16, false, "bf16 weights and activations (--device=cuda)");
ABSL_FLAG(bool, reuse_large_blocks, true,
          "serve every allocation from glibc's heap (M_MMAP_MAX 0, no trimming), so a step "
          "reuses the previous step's freed logits instead of mmapping and page-faulting "
          "fresh zeroed pages (logits and dlogits are 206 MB each at seq 1024)");
ABSL_FLAG(int, kernel_breakdown, 3,
          "after the timed steps, this many more with every kernel timed (on a GPU by CUDA "
          "events around each call; 0: none)");

namespace {

// Milliseconds per step of each kernel over `steps` steps taking `step_ms` in
// all; then what the GEMMs' own time leaves for the model/GEMM ratio.
void PrintKernelBreakdown(const std::vector<loom::core::ops::KernelTime>& totals, int steps,
                          double step_ms, double model_flops_per_step, double gemm_rate,
                          bool gpu) {
  std::printf("\nKernel by kernel (%d more steps, every kernel timed%s; %.1f ms/step):\n\n", steps,
              gpu ? " by CUDA events on its stream" : "", step_ms / steps);
  std::printf(
      "| kernel | calls/step | ms/step | share of the step | GFLOP/s |\n|---|---|---|---|---|\n");
  double kernels_ms = 0, gemm_ms = 0, gemm_flops = 0, optimizer_ms = 0;
  for (const auto& t : totals) {
    const double ms = t.seconds * 1e3 / steps;
    kernels_ms += ms;
    if (t.flops > 0) {
      gemm_ms += ms;
      gemm_flops += t.flops / steps;
    }
    if (t.kernel == "zero" || t.kernel == "sum_squares" || t.kernel == "adamw_step") {
      optimizer_ms += ms;
    }
    std::printf("| %s | %.0f | %.1f | %.1f%% | %s |\n", t.kernel.c_str(),
                static_cast<double>(t.calls) / steps, ms, 100 * ms * steps / step_ms,
                t.flops > 0 ? absl::StrFormat("%.0f", t.flops / t.seconds / 1e9).c_str() : "");
  }
  const double per_step = step_ms / steps;
  std::printf("| outside any kernel (layers, allocation, gaps) | | %.1f | %.1f%% | |\n",
              per_step - kernels_ms, 100 * (per_step - kernels_ms) / per_step);
  if (gemm_ms <= 0) return;
  const double gemm_gflops = gemm_flops / (gemm_ms / 1e3) / 1e9;
  std::printf(
      "\n- GEMMs (matmul, batched_matmul): %.1f ms/step at %.1f GFLOP/s = %.2f of the "
      "same-run reference GEMM rate\n",
      gemm_ms, gemm_gflops, gemm_gflops * 1e9 / gemm_rate);
  std::printf(
      "- best model/GEMM ratio if all but these GEMMs took no time: %.2f; with the "
      "optimizer's kernels (zero, sum_squares, adamw_step: %.1f ms) as measured: %.2f\n",
      model_flops_per_step / (gemm_ms / 1e3) / gemm_rate, optimizer_ms,
      model_flops_per_step / ((gemm_ms + optimizer_ms) / 1e3) / gemm_rate);
}

}  // namespace

int main(int argc, char** argv) {
  loom::core::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  // ~100k page faults and 412 MB of kernel zeroing per step at seq 1024 without it.
  if (absl::GetFlag(FLAGS_reuse_large_blocks)) loom::core::ReuseFreedHostBlocks();
  using loom::core::Tensor;
  loom::layers::GptConfig c;
  c.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  c.ffn_hidden_size = absl::GetFlag(FLAGS_ffn_hidden_size);
  c.group_query_attention = absl::GetFlag(FLAGS_group_query_attention);
  c.num_query_groups = absl::GetFlag(FLAGS_num_query_groups);
  c.untie_embeddings_and_output_weights = absl::GetFlag(FLAGS_untie_embeddings_and_output_weights);
  c.normalization = absl::GetFlag(FLAGS_normalization);
  c.position_embedding_type = absl::GetFlag(FLAGS_position_embedding_type);
  c.swiglu = absl::GetFlag(FLAGS_swiglu);
  c.add_bias_linear = !absl::GetFlag(FLAGS_disable_bias_linear);
  const int64_t b = absl::GetFlag(FLAGS_micro_batch_size);
  loom::train::TrainConfig placement;  // --device / --bf16, checked as the trainer does
  placement.model = c;
  placement.device = absl::GetFlag(FLAGS_device);
  placement.bf16 = absl::GetFlag(FLAGS_bf16);
  absl::Status placed = loom::train::Finalize(&placement, 1);
  if (placed.ok()) {
    placed = loom::train::SelectDevice(&placement, /*local_rank=*/0, /*local_world_size=*/1);
  }
  if (!placed.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(placed.message()).c_str());
    return 2;
  }
  c.device = placement.model.device;
  c.compute_dtype = placement.model.compute_dtype;
  auto model = loom::layers::GptModel::Create(c, loom::layers::TpGroup{});
  if (!model.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  auto opt = loom::train::Optimizer::Create(&(*model)->params(), {}, {});
  if (!opt.ok()) return 1;
  Tensor ids = *loom::layers::testing::RandomIds(c.seq_length, b, c.vocab_size, 1).To(c.device);
  Tensor targets =
      *loom::layers::testing::RandomIds(c.seq_length, b, c.vocab_size, 2).To(c.device);
  loom::layers::DropoutStream dropout;
  dropout.hidden_p = 0.1f;

  // Where a step's time goes: milliseconds of each phase, per timed step.
  // (On a GPU the phases are timed after a synchronize each.)
  enum Phase { kZero, kForward, kBackward, kOptimizer, kPhases };
  const char* const kPhaseNames[kPhases] = {"zero gradients", "forward (with the loss)", "backward",
                                            "optimizer (norm, clip, AdamW)"};
  std::vector<double> phase_ms[kPhases];
  // A failed phase ends the bench with its error (not a bare abort).
  auto must = [](const absl::Status& s, const char* what) {
    if (s.ok()) return;
    std::fprintf(stderr, "bench: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  };
  auto step = [&](int i) -> double {
    auto t = std::chrono::steady_clock::now();
    auto lap = [&](Phase p) {
      must(loom::core::ops::Synchronize(c.device), "synchronize");
      if (i > 0) phase_ms[p].push_back(loom::core::bench::MillisecondsSince(t));
      t = std::chrono::steady_clock::now();
    };
    must((*model)->params().ZeroGrads(), "zero gradients");
    lap(kZero);
    dropout.stream = i;
    loom::layers::GptModel::Saved saved;
    double loss = 0;
    must((*model)->Forward(0, ids, targets, dropout, &saved, &loss).status(), "forward");
    lap(kForward);
    must((*model)->Backward(0, Tensor(), 1.0f, dropout, saved).status(), "backward");
    lap(kBackward);
    must((*opt)->Step(1e-4f).status(), "optimizer");
    lap(kOptimizer);
    return loss;
  };
  step(0);  // warm-up: page in the buffers
  const int iters = absl::GetFlag(FLAGS_iters);
  std::vector<double> ms;
  for (int i = 1; i <= iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step(i);
    ms.push_back(loom::core::bench::MillisecondsSince(t0));
  }
  const double med = loom::core::bench::Median(ms);
  // Same process, same threads (or GPU), now.
  const bool gpu = !c.device.is_cpu();
  const absl::StatusOr<double> measured = loom::train::MeasureGemmFlops(c.device, c.compute_dtype);
  if (!measured.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(measured.status().message()).c_str());
    return 1;
  }
  const double gemm = *measured;
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
  std::printf("| device | %s%s |\n", c.device.ToString().c_str(),
              c.compute_dtype == loom::core::DType::kBF16 ? " bf16" : " f32");
  const int64_t n = loom::train::GemmReferenceSize(c.device);
  std::printf("| GEMM GFLOP/s (%lld^3 %s, %s, same run) | %.1f |\n", (long long)n,
              loom::core::DTypeName(c.compute_dtype), gpu ? "cuBLAS" : "oneDNN", gemm / 1e9);
  std::printf("| model / GEMM | %.2f |\n", achieved / gemm);
  for (int p = 0; p < kPhases; ++p) {
    const double ms_p = loom::core::bench::Median(phase_ms[p]);
    std::printf("| %s, ms (median) | %.1f (%.0f%% of the step) |\n", kPhaseNames[p], ms_p,
                100.0 * ms_p / med);
  }
  std::printf("| large blocks reused (--reuse_large_blocks) | %s |\n",
              absl::GetFlag(FLAGS_reuse_large_blocks) ? "yes" : "no (mmap per block)");

  // After the headline figures, so the timer's clock reads are not in them.
  const int breakdown_steps = absl::GetFlag(FLAGS_kernel_breakdown);
  if (breakdown_steps > 0) {
    // On a GPU each kernel's device time, from CUDA events around the call.
    auto timer = loom::core::ops::KernelTimer::Start(c.device.type);
    if (!timer.ok()) {
      std::fprintf(stderr, "bench: %s\n", std::string(timer.status().message()).c_str());
      return 1;
    }
    double timed_ms = 0;
    for (int i = 0; i < breakdown_steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      step(iters + 1 + i);
      timed_ms += loom::core::bench::MillisecondsSince(t0);
    }
    PrintKernelBreakdown((*timer)->Totals(), breakdown_steps, timed_ms, achieved * med / 1e3, gemm,
                         gpu);
  }
  return 0;
}
