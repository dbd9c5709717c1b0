#ifndef LOOM_PROFILE_TRACE_SVG_H_
#define LOOM_PROFILE_TRACE_SVG_H_

// A merged trace (FormatMergedTrace of a run, or of pipeline::ScheduleTrace's
// plan) drawn as an SVG with timeline/svg.h's writer: one row per rank, one
// sub-lane per track lane ("main", "comm tp", ...), spans coloured by name
// (the same name, the same colour in every row), time in ms from the first
// span.

#include <string>

#include "profile/chrome_trace.h"

namespace loom::profile {

std::string RenderTraceSvg(const ParsedTrace& trace, const std::string& title);

}  // namespace loom::profile

#endif  // LOOM_PROFILE_TRACE_SVG_H_
