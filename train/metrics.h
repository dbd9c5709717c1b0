#ifndef LOOM_TRAIN_METRICS_H_
#define LOOM_TRAIN_METRICS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "layers/gpt_config.h"

namespace loom::train {

// Model FLOPs per token, forward + backward, no recomputation
// (parallelism-spec.md): 6·N + 12·L·h·s, N the parameter count.
double ModelFlopsPerToken(const layers::GptConfig& config);

// FLOP/s of a 1024³ f32 GEMM through our CPU path, measured now on this rank:
// the CPU peak that MFU is stated against (unless --peak-flops is given).
double MeasureGemmFlops();

struct StepMetrics {
  int64_t iteration = 0;
  double loss = 0;
  float lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double model_tflops_per_rank = 0;  // achieved model TFLOP/s per rank
  double mfu = 0;                    // against the per-rank peak
  double elapsed_s = 0;
  double eta_s = 0;
};

// The machine-readable log: one JSON object per line.
class MetricsFile {
 public:
  static absl::StatusOr<MetricsFile> Open(const std::string& path);  // "" = disabled
  MetricsFile() = default;
  MetricsFile(MetricsFile&& o) noexcept : f_(o.f_) { o.f_ = nullptr; }
  MetricsFile& operator=(MetricsFile&& o) noexcept;
  ~MetricsFile();

  void WriteStep(const StepMetrics& m);
  void WriteEval(int64_t iteration, double valid_loss);

 private:
  explicit MetricsFile(std::FILE* f) : f_(f) {}
  std::FILE* f_ = nullptr;
};

// The human-readable log line, Megatron style.
std::string FormatStep(const StepMetrics& m, int64_t train_iters);

}  // namespace loom::train

#endif  // LOOM_TRAIN_METRICS_H_
