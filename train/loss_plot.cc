#include "train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace loom::train {

absl::StatusOr<LossCurve> ReadMetrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open --metrics-file=", path));
  LossCurve curve;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("iteration")) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": expected a JSON object with \"iteration\""));
    }
    const double it = j["iteration"].get<double>();
    if (j.contains("loss")) curve.train.emplace_back(it, j["loss"].get<double>());
    if (j.contains("valid_loss")) curve.valid.emplace_back(it, j["valid_loss"].get<double>());
  }
  if (curve.train.empty() && curve.valid.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no loss values"));
  }
  return curve;
}

std::string RenderLossSvg(const LossCurve& curve, const std::string& title) {
  const double W = 720, H = 420, L = 70, R = 20, T = 40, B = 50;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto* series : {&curve.train, &curve.valid}) {
    for (const auto& [x, y] : *series) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  y0 = std::max(0.0, y0 - 0.05 * (y1 - y0));
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n<text x=\"%.0f\" y=\"24\" font-size=\"16\">%s</text>\n",
      W, H, L, title);
  for (int i = 0; i <= 5; ++i) {
    const double y = y0 + (y1 - y0) * i / 5;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n",
                          L, py(y), W - R, py(y), L - 6, py(y) + 4, y);
    const double x = x0 + (x1 - x0) * i / 5;
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n",
                          px(x), H - B + 18, x);
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">iteration</text>\n"
                        "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
                        "text-anchor=\"middle\">loss (nats/token)</text>\n",
                        (L + W - R) / 2, H - 8, (T + H - B) / 2, (T + H - B) / 2);
  if (!curve.train.empty()) {
    svg += "<polyline class=\"train\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : curve.train) absl::StrAppendFormat(&svg, "%.1f,%.1f ", px(x), py(y));
    svg += "\"/>\n";
  }
  for (const auto& [x, y] : curve.valid) {
    absl::StrAppendFormat(&svg, "<circle class=\"valid\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#d62728\"/>\n",
                          px(x), py(y));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">train</text>"
                        "<text x=\"%.0f\" y=\"%.0f\" fill=\"#d62728\">valid</text>\n</svg>\n",
                        W - 120, T + 14, W - 70, T + 14);
  return svg;
}

}  // namespace loom::train
