#include "train/metrics.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::train {

double ModelFlopsPerToken(const layers::GptConfig& c) {
  return 6.0 * static_cast<double>(layers::ActiveParameterCount(c)) +
         12.0 * c.num_layers * c.hidden_size * c.seq_length;
}

int64_t GemmReferenceSize(core::Device device) { return device.is_cpu() ? 1024 : 4096; }

absl::StatusOr<double> MeasureGemmFlops(core::Device device, core::DType dtype) {
  const int64_t n = GemmReferenceSize(device);
  const core::Shape shape{n, n};
  LOOM_ASSIGN_OR_RETURN(core::Tensor host, core::Tensor::Zeros(shape, core::DType::kF32));
  LOOM_ASSIGN_OR_RETURN(core::Tensor on_device, host.To(device));
  LOOM_ASSIGN_OR_RETURN(core::Tensor a, core::Tensor::Empty(shape, dtype, device));
  LOOM_ASSIGN_OR_RETURN(core::Tensor b, core::Tensor::Empty(shape, dtype, device));
  LOOM_ASSIGN_OR_RETURN(core::Tensor c, core::Tensor::Empty(shape, dtype, device));
  LOOM_RETURN_IF_ERROR(core::ops::Convert(on_device, &a));
  LOOM_RETURN_IF_ERROR(core::ops::Convert(on_device, &b));
  LOOM_RETURN_IF_ERROR(core::ops::Matmul(a, b, &c));  // warm-up
  // The fastest of several: a peak, so a descheduled repetition on a shared
  // machine does not lower the MFU denominator.
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    LOOM_RETURN_IF_ERROR(core::ops::Synchronize(device));
    const auto t0 = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(core::ops::Matmul(a, b, &c));
    LOOM_RETURN_IF_ERROR(core::ops::Synchronize(device));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best;
}

absl::StatusOr<MetricsFile> MetricsFile::Open(const std::string& path) {
  if (path.empty()) return MetricsFile();
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return absl::PermissionDeniedError("cannot open --metrics-file=" + path + " for appending");
  }
  return MetricsFile(f);
}

MetricsFile& MetricsFile::operator=(MetricsFile&& o) noexcept {
  if (f_ != nullptr) std::fclose(f_);
  f_ = o.f_;
  o.f_ = nullptr;
  return *this;
}

MetricsFile::~MetricsFile() {
  if (f_ != nullptr) std::fclose(f_);
}

void MetricsFile::WriteStep(const StepMetrics& m) {
  if (f_ == nullptr) return;
  // Memory: rank 0's peak bytes, total and per category, and the ranks' max.
  std::string memory;
  if (m.memory.total_peak > 0) {
    memory = absl::StrFormat(", \"mem_peak_bytes\": %d", m.memory.total_peak);
    if (m.memory_peak_max > 0) {
      absl::StrAppendFormat(&memory, ", \"mem_peak_max_bytes\": %d", m.memory_peak_max);
    }
    memory += ", \"mem_peak_by_category\": {";
    for (int c = 0; c < core::kNumMemoryCategories; ++c) {
      absl::StrAppendFormat(&memory, "%s\"%s\": %d", c ? ", " : "",
                            core::MemoryCategoryName(static_cast<core::MemoryCategory>(c)),
                            m.memory.peak[c]);
    }
    memory += "}";
    if (m.memory.reserved > 0) {
      absl::StrAppendFormat(&memory, ", \"mem_reserved_bytes\": %d", m.memory.reserved);
    }
  }
  std::fprintf(f_,
               "{\"iteration\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, "
               "\"tokens_per_s\": %.1f, \"model_tflops_per_rank\": %.6f, \"mfu\": %.4f, "
               "\"elapsed_s\": %.3f%s}\n",
               static_cast<long long>(m.iteration), m.loss, m.lr, m.grad_norm, m.tokens_per_s,
               m.model_tflops_per_rank, m.mfu, m.elapsed_s, memory.c_str());
  std::fflush(f_);
}

void MetricsFile::WriteEval(int64_t iteration, double valid_loss) {
  if (f_ == nullptr) return;
  std::fprintf(f_, "{\"iteration\": %lld, \"valid_loss\": %.6f}\n",
               static_cast<long long>(iteration), valid_loss);
  std::fflush(f_);
}

std::string FormatStep(const StepMetrics& m, int64_t train_iters) {
  std::string line = absl::StrFormat(
      " iteration %6d/%6d | loss %.4f | lr %.3e | grad norm %.3f | tokens/s %.0f | "
      "TFLOP/s/rank %.4f | MFU %.1f%% | elapsed %.1fs | ETA %.0fs",
      m.iteration, train_iters, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.model_tflops_per_rank,
      100.0 * m.mfu, m.elapsed_s, m.eta_s);
  if (m.memory.total_peak > 0) {
    absl::StrAppend(&line, " | mem ", core::FormatBytes(m.memory.total_peak), " peak");
    if (m.memory_peak_max > 0) {
      absl::StrAppend(&line, " (max over ranks ", core::FormatBytes(m.memory_peak_max), ")");
    }
  }
  return line;
}

std::string FormatMemory(const std::string& label, const core::MemoryStats& s) {
  std::string line = label + ":";
  for (int c = 0; c < core::kNumMemoryCategories; ++c) {
    absl::StrAppend(&line, c ? ", " : " ",
                    core::MemoryCategoryName(static_cast<core::MemoryCategory>(c)), " ",
                    core::FormatBytes(s.peak[c]));
    if (s.current[c] != s.peak[c]) {
      absl::StrAppend(&line, " (now ", core::FormatBytes(s.current[c]), ")");
    }
  }
  absl::StrAppend(&line, ", total ", core::FormatBytes(s.total_peak), " (now ",
                  core::FormatBytes(s.total_current), ")");
  if (s.reserved > 0) absl::StrAppend(&line, ", reserved ", core::FormatBytes(s.reserved));
  return line;
}

}  // namespace loom::train
