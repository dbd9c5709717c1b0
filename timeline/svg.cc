#include "timeline/svg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace loom::timeline {
namespace {

// A tick step of 1, 2 or 5 times a power of ten giving about 10 to 20 ticks.
double TickStep(double makespan) {
  double step = 1;
  while (makespan / step > 20) {
    if (makespan / (step * 2) <= 20) return step * 2;
    if (makespan / (step * 5) <= 20) return step * 5;
    step *= 10;
  }
  return step;
}

}  // namespace

std::string EscapeXml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string SvgColor(double h, double s, double l) {
  const double c = (1 - std::fabs(2 * l - 1)) * s;
  const double hp = std::fmod(h, 360.0) / 60.0;
  const double x = c * (1 - std::fabs(std::fmod(hp, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  if (hp < 1) { r = c; g = x; }
  else if (hp < 2) { r = x; g = c; }
  else if (hp < 3) { g = c; b = x; }
  else if (hp < 4) { g = x; b = c; }
  else if (hp < 5) { r = x; b = c; }
  else { r = c; b = x; }
  const double m = l - c / 2;
  auto byte = [&](double v) { return static_cast<int>(std::lround(std::clamp(v + m, 0.0, 1.0) * 255)); };
  return absl::StrFormat("#%02x%02x%02x", byte(r), byte(g), byte(b));
}

void AppendTimeAxis(std::string* svg, int axis_y, int plot_w, double makespan, double ppu,
                    const std::string& unit) {
  absl::StrAppendFormat(svg,
                        "<g class=\"axis\"><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                        "stroke=\"#333\"/>\n",
                        kLeft, axis_y, kLeft + plot_w, axis_y);
  const double step = TickStep(makespan);
  for (double t = 0; t <= makespan + 1e-9; t += step) {
    const double x = kLeft + t * ppu;
    absl::StrAppendFormat(svg,
                          "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333\"/>"
                          "<text x=\"%.2f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">"
                          "%g</text>\n",
                          x, axis_y, x, axis_y + 4, x, axis_y + 16, t);
  }
  absl::StrAppendFormat(svg,
                        "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#444\">time (%s)"
                        "</text></g>\n",
                        kLeft, axis_y + 34, EscapeXml(unit));
}

void AppendSvgOpening(std::string* svg, int width, int height) {
  absl::StrAppendFormat(svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  absl::StrAppendFormat(svg,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n",
                        width, height, width, height);
}

std::string RenderRowsSvg(const std::vector<SvgRow>& rows, const std::string& title,
                          const std::string& time_unit, const SvgOptions& opt) {
  double makespan = 1e-9;
  for (const SvgRow& row : rows) {
    for (const SvgBox& b : row.boxes) makespan = std::max(makespan, b.end);
  }
  const double ppu = opt.pixels_per_unit > 0 ? opt.pixels_per_unit : opt.target_width / makespan;
  const int plot_w = static_cast<int>(std::ceil(makespan * ppu));
  const int width = kLeft + plot_w + kRight;
  std::vector<int> row_y;
  int y = kTop;
  for (const SvgRow& row : rows) {
    row_y.push_back(y);
    y += std::max(1, row.lanes) * opt.row_height + kRowGap;
  }
  const int axis_y = y;
  const int height = axis_y + 56;
  std::string svg;
  AppendSvgOpening(&svg, width, height);
  svg += "<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  absl::StrAppendFormat(&svg, "<text class=\"title\" x=\"%d\" y=\"24\" font-size=\"16\" "
                              "font-weight=\"bold\">%s</text>\n",
                        kLeft, EscapeXml(title));
  if (!opt.subtitle.empty()) {
    absl::StrAppendFormat(&svg, "<text class=\"subtitle\" x=\"%d\" y=\"44\" font-size=\"12\" "
                                "fill=\"#444\">%s</text>\n",
                          kLeft, EscapeXml(opt.subtitle));
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const SvgRow& row = rows[r];
    const int ry = row_y[r], rh = std::max(1, row.lanes) * opt.row_height;
    absl::StrAppendFormat(&svg, "<g class=\"row\" data-row=\"%d\">\n", r);
    absl::StrAppendFormat(&svg,
                          "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"end\">%s"
                          "</text>\n",
                          kLeft - 8, ry + opt.row_height / 2 + 5, EscapeXml(row.label));
    absl::StrAppendFormat(&svg,
                          "<rect class=\"row\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                          "fill=\"#f4f4f4\" stroke=\"#ccc\"/>\n",
                          kLeft, ry, plot_w, rh);
    for (const SvgBox& b : row.boxes) {
      const double x = kLeft + b.start * ppu, w = std::max(0.5, (b.end - b.start) * ppu);
      const int by = ry + b.lane * opt.row_height;
      absl::StrAppendFormat(&svg,
                            "<rect class=\"box\" data-row=\"%d\" data-name=\"%s\" x=\"%.2f\" "
                            "y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"#333\" "
                            "stroke-width=\"0.4\"><title>%s</title></rect>\n",
                            r, EscapeXml(b.name), x, by + 1, w, opt.row_height - 2, b.fill,
                            EscapeXml(b.title));
      const double font = std::min(12.0, opt.row_height * 0.45);
      if (w > 0.6 * font * b.name.size() + 4) {
        absl::StrAppendFormat(&svg,
                              "<text x=\"%.2f\" y=\"%d\" font-size=\"%d\" "
                              "text-anchor=\"middle\">%s</text>\n",
                              x + w / 2, by + opt.row_height / 2 + static_cast<int>(font) / 3,
                              static_cast<int>(font), EscapeXml(b.name));
      }
    }
    svg += "</g>\n";
  }
  AppendTimeAxis(&svg, axis_y, plot_w, makespan, ppu, time_unit);
  svg += "</svg>\n";
  return svg;
}

}  // namespace loom::timeline
