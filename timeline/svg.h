#ifndef LOOM_TIMELINE_SVG_H_
#define LOOM_TIMELINE_SVG_H_

// Timelines as SVG: rows of timed boxes, time to the right. The one writer
// behind //pipeline:visualize's schedules (pipeline/timeline_svg.h) and
// //profile:timeline_svg's measured traces (profile/trace_svg.h), so both
// draw the same frame (labels left, titles above, a time axis below). Its own
// package so that neither of the two depends on the other for it.

#include <string>
#include <vector>

namespace loom::timeline {

// The frame, in pixels: room for row labels on the left, the title lines on
// top, a margin on the right and a gap between rows.
inline constexpr int kLeft = 80;
inline constexpr int kTop = 64;
inline constexpr int kRight = 20;
inline constexpr int kRowGap = 6;

struct SvgOptions {
  double pixels_per_unit = 0;  // 0: fit the makespan into about target_width pixels
  int target_width = 1100;     // timeline width in pixels when pixels_per_unit is 0
  int row_height = 34;         // pixels per row (per lane of a row)
  std::string subtitle;        // optional second title line, e.g. the costs used
};

// Any rows of boxes: one row per entry, labelled, time to the right from 0,
// boxes <rect class="box" data-row="r" data-name="..."> with their title as
// tooltip; a box may sit in a sub-lane of its row (nested spans).
struct SvgBox {
  double start = 0, end = 0;
  std::string name;   // data-name, and the label when it fits
  std::string fill;   // "#rrggbb" (SvgColor)
  std::string title;  // tooltip
  int lane = 0;       // 0 .. lanes-1 of its row, top to bottom
};
struct SvgRow {
  std::string label;
  int lanes = 1;
  std::vector<SvgBox> boxes;
};
std::string RenderRowsSvg(const std::vector<SvgRow>& rows, const std::string& title,
                          const std::string& time_unit, const SvgOptions& options = {});

// "#rrggbb" of an HSL colour (hue in degrees, saturation and lightness in
// [0, 1]); hex works in every renderer.
std::string SvgColor(double hue, double saturation, double lightness);

// `s` with &, <, > and " escaped, for text and attribute values.
std::string EscapeXml(const std::string& s);

// The document's opening: the XML declaration and the <svg> element of
// width x height pixels (its closing tag is the caller's).
void AppendSvgOpening(std::string* svg, int width, int height);

// The time axis under the rows at y = axis_y: a line plot_w wide from kLeft,
// ticks every 1, 2 or 5 times a power of ten (10 to 20 of them up to
// `makespan`), `pixels_per_unit` apart per unit, and "time (unit)".
void AppendTimeAxis(std::string* svg, int axis_y, int plot_w, double makespan,
                    double pixels_per_unit, const std::string& unit);

}  // namespace loom::timeline

#endif  // LOOM_TIMELINE_SVG_H_
