// //core/cpu:vocab_ce_bench — the vocab-parallel cross-entropy's forward,
// "unfused" (VocabShardRowMax, then VocabShardSumExp: two reads of the
// logits) against "online" (VocabShardRowMaxSumExp: one read, both
// reductions per row while it is in the cache), in the same run.
//
//   bazel run -c opt //core/cpu:vocab_ce_bench [-- --rows=8192 --vocab=50304 --reps=5]
//
// The two alternate (unfused, online, ...) --reps times; medians reported,
// with the logits' bytes over each time (GB/s). Speed lives here; tests never
// time things. The backward (a third read, unchanged) is not timed.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "core/bench_util/bench_util.h"
#include "core/cpu/vocab_parallel_ce.h"
#include "core/tensor.h"

ABSL_FLAG(int64_t, rows, 8 * 1024, "rows: micro-batch x sequence (8 x 1024)");
ABSL_FLAG(int64_t, vocab, 50304, "local vocabulary columns (GPT-2 padded: 50304)");
ABSL_FLAG(int, reps, 5, "alternating samples per implementation (median reported)");

namespace loom::core::cpu {
namespace {

using Clock = std::chrono::steady_clock;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "vocab_ce_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

int Main() {
  const int64_t n = absl::GetFlag(FLAGS_rows), v = absl::GetFlag(FLAGS_vocab);
  const int reps = absl::GetFlag(FLAGS_reps);
  absl::StatusOr<Tensor> logits = Tensor::Empty(Shape{n, v}, DType::kF32);
  Check(logits.status());
  // Random logits (never time constant data); filled in parallel chunks.
  float* l = logits->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    std::mt19937 rng(static_cast<uint32_t>(i));
    std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
    for (int64_t j = 0; j < v; ++j) l[i * v + j] = dist(rng);
  }
  absl::StatusOr<Tensor> targets = Tensor::Empty(Shape{n}, DType::kI32);
  Check(targets.status());
  for (int64_t i = 0; i < n; ++i) targets->data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % v);
  const VocabShard shard{0, v, v};
  Tensor max = *Tensor::Empty(Shape{n}, DType::kF32);
  Tensor sums = *Tensor::Empty(Shape{2, n}, DType::kF32);
  std::vector<double> unfused, online;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    Check(VocabShardRowMax(*logits, shard, &max));
    Check(VocabShardSumExp(*logits, *targets, max, shard, &sums));
    unfused.push_back(bench::MillisecondsSince(t0));
    t0 = Clock::now();
    Check(VocabShardRowMaxSumExp(*logits, *targets, shard, &max, &sums));
    online.push_back(bench::MillisecondsSince(t0));
  }
  const double u = bench::Median(unfused), o = bench::Median(online);
  const double gb = static_cast<double>(logits->nbytes()) / 1e9;
  std::printf("vocab_ce_bench on %s: %lld rows x %lld vocab f32 (%.2f GB of logits), %d reps\n",
              bench::CpuModel().c_str(), static_cast<long long>(n), static_cast<long long>(v), gb,
              reps);
  std::printf("  unfused (row max + sum exp): %9.1f ms  (%.1f GB/s of logits per call)\n", u,
              gb / (u / 1e3));
  std::printf("  online  (one read per row):  %9.1f ms  (%.1f GB/s)\n", o, gb / (o / 1e3));
  std::printf("  online / unfused: %.3f\n", o / u);
  return 0;
}

}  // namespace
}  // namespace loom::core::cpu

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::core::cpu::Main();
}
