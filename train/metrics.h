#ifndef LOOM_TRAIN_METRICS_H_
#define LOOM_TRAIN_METRICS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/memory_stats.h"
#include "models/gpt/gpt_config.h"

namespace loom::train {

// Model FLOPs per token, forward + backward, no recomputation
// (docs/PARALLELISM.md): 6·N + 12·L·h·s, N the parameter count (of an MoE
// model the active ones: top-k of each MoE layer's experts).
double ModelFlopsPerToken(const layers::GptConfig& config);

// FLOP/s of an n³ GEMM in `dtype` on `device` through core/ops, measured now
// on this rank (the fastest of 8, device synchronised around each): the peak
// MFU is stated against unless --peak-flops is given. n = 1024 on the CPU,
// 4096 on a GPU. Status errors (no kernels for the device, out of memory)
// come back as such.
absl::StatusOr<double> MeasureGemmFlops(core::Device device = core::Device::CPU(),
                                        core::DType dtype = core::DType::kF32);
int64_t GemmReferenceSize(core::Device device);

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
  // Memory of the logging rank (rank 0) on the model's device since the end
  // of the setup (core/memory_stats.h): per-category current and peak bytes.
  // Not shown when total_peak is 0.
  core::MemoryStats memory;
  int64_t memory_peak_max = 0;  // the largest total peak over the ranks (0: one rank)
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

// One line of --memory-report: "<label>: parameters 12.5 MiB, gradients
// 12.5 MiB, optimizer 25.0 MiB, activations 88.1 MiB (now 0 B), communication
// 4.00 MiB, other 1.00 MiB, total 142 MiB (now 54.0 MiB)": the peaks of `s`,
// each with its current value where that differs, and ", reserved X" when
// s.reserved > 0.
std::string FormatMemory(const std::string& label, const core::MemoryStats& s);

}  // namespace loom::train

#endif  // LOOM_TRAIN_METRICS_H_
