#include "pipeline/timeline_svg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "pipeline/timeline_text.h"
#include "timeline/svg.h"

namespace loom::pipeline {

using timeline::kLeft;
using timeline::kRight;
using timeline::kRowGap;
using timeline::kTop;

std::string RenderTimelineSvg(const Schedule& schedule, const SimResult& result,
                              const timeline::SvgOptions& opt) {
  const ScheduleOptions& so = schedule.options;
  const double makespan = std::max(result.makespan, 1e-9);
  const double ppu =
      opt.pixels_per_unit > 0 ? opt.pixels_per_unit : opt.target_width / makespan;
  const int rows = static_cast<int>(result.stages.size());
  const int plot_w = static_cast<int>(std::ceil(makespan * ppu));
  const int width = kLeft + plot_w + kRight;
  const int axis_y = kTop + rows * (opt.row_height + kRowGap);
  const int height = axis_y + 56;

  std::string svg;
  timeline::AppendSvgOpening(&svg, width, height);
  svg +=
      "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" "
      "stroke=\"white\" stroke-opacity=\"0.35\" stroke-width=\"2\"/></pattern>"
      "<pattern id=\"dots\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\">"
      "<circle cx=\"2.5\" cy=\"2.5\" r=\"1\" fill=\"white\" fill-opacity=\"0.5\"/>"
      "</pattern></defs>\n";
  svg += "<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"white\"/>\n";

  // Title: the schedule and its bubble.
  const std::string title = absl::StrFormat(
      "%s: bubble %.4f (textbook %s = %.4f), makespan %g", DescribeSchedule(so),
      result.bubble_fraction, BubbleFormula(so), TheoreticalBubble(so), result.makespan);
  absl::StrAppendFormat(&svg, "<text class=\"title\" x=\"%d\" y=\"24\" font-size=\"16\" "
                              "font-weight=\"bold\">%s</text>\n",
                        kLeft, timeline::EscapeXml(title));
  const std::string subtitle =
      opt.subtitle.empty()
          ? std::string(SplitsBackward(so.kind)
                            ? "light box = forward, dark hatched = input grad (I), medium dotted "
                              "= weight grad (W); label = micro-batch.chunk"
                            : "light box = forward, dark hatched = backward; label = "
                              "micro-batch.chunk")
          : opt.subtitle;
  absl::StrAppendFormat(&svg, "<text class=\"subtitle\" x=\"%d\" y=\"44\" font-size=\"12\" "
                              "fill=\"#444\">%s</text>\n",
                        kLeft, timeline::EscapeXml(subtitle));

  for (int r = 0; r < rows; ++r) {
    const int y = kTop + r * (opt.row_height + kRowGap);
    absl::StrAppendFormat(&svg, "<g class=\"stage\" data-stage=\"%d\">\n", r);
    absl::StrAppendFormat(&svg,
                          "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"end\">"
                          "stage %d</text>\n",
                          kLeft - 8, y + opt.row_height / 2 + 5, r);
    // The row's full extent; what stays visible of it is idle time.
    absl::StrAppendFormat(&svg,
                          "<rect class=\"row\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                          "fill=\"#f4f4f4\" stroke=\"#ccc\"/>\n",
                          kLeft, y, plot_w, opt.row_height);
    for (const TimedAction& t : result.stages[r].actions) {
      const Action& a = t.action;
      if (!IsCompute(a.kind)) continue;
      const bool fwd = a.kind == ActionKind::kForward;
      const bool weight = a.kind == ActionKind::kBackwardWeight;
      const char* cls = fwd                                         ? "fwd"
                        : a.kind == ActionKind::kBackward           ? "bwd"
                        : a.kind == ActionKind::kBackwardInput      ? "bwd-input"
                                                                    : "bwd-weight";
      const double hue = 360.0 * a.micro_batch / std::max(1, so.micro_batches);
      const double x = kLeft + t.start * ppu;
      const double w = (t.end - t.start) * ppu;
      absl::StrAppendFormat(
          &svg,
          "<rect class=\"%s\" data-stage=\"%d\" data-mb=\"%d\" data-chunk=\"%d\" x=\"%.2f\" "
          "y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"#333\" "
          "stroke-width=\"0.6\"><title>%s [%g, %g)</title></rect>\n",
          cls, r, a.micro_batch, a.chunk, x, y, w, opt.row_height,
          timeline::SvgColor(hue, 0.7, fwd ? 0.75 : weight ? 0.55 : 0.40), ToShortString(a),
          t.start, t.end);
      if (!fwd) {
        absl::StrAppendFormat(&svg,
                              "<rect class=\"%s\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" "
                              "height=\"%d\" fill=\"url(#%s)\"/>\n",
                              weight ? "dots" : "hatch", x, y, w, opt.row_height,
                              weight ? "dots" : "hatch");
      }
      // Label "m.c", as large as fits the box (a glyph is about 0.6 em wide).
      const std::string label = absl::StrFormat("%d.%d", a.micro_batch, a.chunk);
      const int font = static_cast<int>(
          std::clamp((w - 2) / (0.6 * label.size()), 5.0, std::min(14.0, opt.row_height * 0.45)));
      absl::StrAppendFormat(&svg,
                            "<text x=\"%.2f\" y=\"%d\" font-size=\"%d\" text-anchor=\"middle\" "
                            "fill=\"%s\">%s</text>\n",
                            x + w / 2, y + opt.row_height / 2 + font / 3, font,
                            fwd ? "#000" : "#fff", label);
    }
    svg += "</g>\n";
  }

  timeline::AppendTimeAxis(&svg, axis_y, plot_w, makespan, ppu, "cost units");
  svg += "</svg>\n";
  return svg;
}

}  // namespace loom::pipeline
