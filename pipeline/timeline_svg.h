#ifndef LOOM_PIPELINE_TIMELINE_SVG_H_
#define LOOM_PIPELINE_TIMELINE_SVG_H_

#include <string>

#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "timeline/svg.h"

namespace loom::pipeline {

// Draws a simulated schedule as an SVG timeline, like the figures of the Megatron papers:
// one row per stage, time to the right, one box per compute action (in timeline/svg.h's frame).
// - Forward boxes: <rect class="fwd" data-stage="r" data-mb="m" data-chunk="c" ...>, a light
//   shade of the micro-batch's hue. Backward boxes: class="bwd", a darker shade of the same hue
//   with a hatch overlay (a separate rect of class="hatch"). Labels "m.c" (micro-batch.chunk).
// - Idle time is the gaps between boxes; the title carries the bubble fraction.
// So each stage row holds exactly M·v rects of class "fwd" and M·v of class "bwd".
// Split backward (zb-h1, zbv): instead of "bwd", M·v rects of class "bwd-input" (BackwardInput,
// dark, hatched) and M·v of class "bwd-weight" (BackwardWeight, medium shade, a dotted overlay
// rect of class "dots").
std::string RenderTimelineSvg(const Schedule& schedule, const SimResult& result,
                              const timeline::SvgOptions& options = {});

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_TIMELINE_SVG_H_
