#ifndef LOOM_PIPELINE_TIMELINE_SVG_H_
#define LOOM_PIPELINE_TIMELINE_SVG_H_

#include <string>
#include <vector>

#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace loom::pipeline {

// Draws a simulated schedule as an SVG timeline, like the figures of the Megatron papers:
// one row per stage, time to the right, one box per compute action.
// - Forward boxes: <rect class="fwd" data-stage="r" data-mb="m" data-chunk="c" ...>, a light
//   shade of the micro-batch's hue. Backward boxes: class="bwd", a darker shade of the same hue
//   with a hatch overlay (a separate rect of class="hatch"). Labels "m.c" (micro-batch.chunk).
// - Idle time is the gaps between boxes; the title carries the bubble fraction.
// So each stage row holds exactly M·v rects of class "fwd" and M·v of class "bwd".
struct SvgOptions {
  double pixels_per_unit = 0;  // 0: fit the makespan into about target_width pixels
  int target_width = 1100;     // timeline width in pixels when pixels_per_unit is 0
  int row_height = 34;         // pixels per stage row
  std::string subtitle;        // optional second title line, e.g. the costs used
};

std::string RenderTimelineSvg(const Schedule& schedule, const SimResult& result,
                              const SvgOptions& options = {});

// The same drawing for any rows of boxes (//profile:timeline_svg draws a
// measured trace with it): one row per entry, labelled, time to the right
// from 0, boxes <rect class="box" data-row="r" data-name="..."> with their
// title as tooltip; a box may sit in a sub-lane of its row (nested spans).
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
// "#rrggbb" of an HSL colour (hue in degrees, saturation and lightness in [0, 1]).
std::string SvgColor(double hue, double saturation, double lightness);

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_TIMELINE_SVG_H_
