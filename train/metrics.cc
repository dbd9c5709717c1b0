#include "train/metrics.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/cpu/matmul.h"

namespace loom::train {

double ModelFlopsPerToken(const layers::GptConfig& c) {
  return 6.0 * static_cast<double>(layers::ParameterCount(c)) +
         12.0 * c.num_layers * c.hidden_size * c.seq_length;
}

double MeasureGemmFlops() {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  auto gemm = [&] {
    (void)core::cpu::Sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  gemm();  // warm-up
  // The fastest of several: a peak, so a descheduled repetition on a shared
  // machine does not lower the MFU denominator.
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    gemm();
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
  std::fprintf(f_,
               "{\"iteration\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, "
               "\"tokens_per_s\": %.1f, \"model_tflops_per_rank\": %.6f, \"mfu\": %.4f, "
               "\"elapsed_s\": %.3f}\n",
               static_cast<long long>(m.iteration), m.loss, m.lr, m.grad_norm, m.tokens_per_s,
               m.model_tflops_per_rank, m.mfu, m.elapsed_s);
  std::fflush(f_);
}

void MetricsFile::WriteEval(int64_t iteration, double valid_loss) {
  if (f_ == nullptr) return;
  std::fprintf(f_, "{\"iteration\": %lld, \"valid_loss\": %.6f}\n",
               static_cast<long long>(iteration), valid_loss);
  std::fflush(f_);
}

std::string FormatStep(const StepMetrics& m, int64_t train_iters) {
  return absl::StrFormat(
      " iteration %6d/%6d | loss %.4f | lr %.3e | grad norm %.3f | tokens/s %.0f | "
      "TFLOP/s/rank %.4f | MFU %.1f%% | elapsed %.1fs | ETA %.0fs",
      m.iteration, train_iters, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.model_tflops_per_rank,
      100.0 * m.mfu, m.elapsed_s, m.eta_s);
}

}  // namespace loom::train
