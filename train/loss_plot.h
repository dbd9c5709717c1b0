#ifndef LOOM_TRAIN_LOSS_PLOT_H_
#define LOOM_TRAIN_LOSS_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::train {

struct LossCurve {
  std::vector<std::pair<double, double>> train;  // (iteration, loss)
  std::vector<std::pair<double, double>> valid;  // (iteration, valid_loss)
};

// Reads a --metrics-file (JSON lines); errors name the file and line.
absl::StatusOr<LossCurve> ReadMetrics(const std::string& path);

// An SVG line chart: training loss as a line, validation loss as dots.
std::string RenderLossSvg(const LossCurve& curve, const std::string& title);

}  // namespace loom::train

#endif  // LOOM_TRAIN_LOSS_PLOT_H_
