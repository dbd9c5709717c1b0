#include "profile/trace_svg.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_format.h"
#include "timeline/svg.h"

namespace loom::profile {

namespace {

// How many spans of the same lane enclose each span.
std::vector<int> NestingDepths(const std::vector<Event>& spans, const std::vector<int>& lanes) {
  std::vector<int> depth(spans.size(), 0);
  for (size_t i = 0; i < spans.size(); ++i) {
    const double start = spans[i].ts_us, end = start + spans[i].dur_us;
    for (size_t j = 0; j < spans.size(); ++j) {
      if (j == i || lanes[j] != lanes[i]) continue;
      const double s = spans[j].ts_us, e = s + spans[j].dur_us;
      // Encloses: contains it, and is strictly longer (or the first of equals).
      if (s <= start && e >= end && (e - s > end - start || j < i)) ++depth[i];
    }
  }
  return depth;
}

}  // namespace

std::string RenderTraceSvg(const ParsedTrace& trace, const std::string& title) {
  double origin = std::numeric_limits<double>::infinity();
  std::map<std::string, int> names;  // name -> colour index, in sorted order
  std::map<int, std::vector<const Event*>> by_pid;
  for (const Event& e : trace.events) {
    origin = std::min(origin, e.ts_us);
    names.emplace(e.name, 0);
    by_pid[e.pid].push_back(&e);
  }
  int k = 0;
  for (auto& [name, index] : names) index = k++;
  std::map<int, std::string> labels(trace.processes.begin(), trace.processes.end());
  std::vector<timeline::SvgRow> rows;
  for (auto& [pid, events] : by_pid) {
    timeline::SvgRow row;
    row.label = labels.count(pid) ? labels[pid] : absl::StrFormat("rank %d", pid);
    // Sub-lanes: "main" first, then the other tracks, each split where its
    // spans overlap without nesting.
    std::map<std::pair<int, std::string>, std::vector<const Event*>> tracks;
    for (const Event* e : events) tracks[{e->track == "main" ? 0 : 1, e->track}].push_back(e);
    int lane0 = 0;
    for (auto& [key, spans] : tracks) {
      std::vector<Event> copy;
      for (const Event* e : spans) copy.push_back(*e);
      const std::vector<int> lanes = AssignLanes(copy);
      // Within a lane, a span nested in another goes one sub-row below it
      // (Perfetto stacks them the same way): sub-row = (lane, depth).
      const std::vector<int> depths = NestingDepths(copy, lanes);
      std::map<std::pair<int, int>, int> sub_rows;
      for (size_t i = 0; i < spans.size(); ++i) sub_rows.emplace(std::pair{lanes[i], depths[i]}, 0);
      int used = 0;
      for (auto& [lane_depth, index] : sub_rows) index = used++;
      for (size_t i = 0; i < spans.size(); ++i) {
        const Event& e = *spans[i];
        timeline::SvgBox b;
        b.start = (e.ts_us - origin) / 1000;
        b.end = (e.ts_us + e.dur_us - origin) / 1000;
        b.name = e.name;
        const double hue = 360.0 * names[e.name] / std::max<size_t>(1, names.size());
        b.fill = timeline::SvgColor(hue, 0.65, e.cat == "comm" || e.cat == "p2p" ? 0.45 : 0.7);
        b.title = absl::StrFormat("%s (%s) %.3f ms on %s %s", e.name, e.cat, e.dur_us / 1000,
                                  e.track, e.args);
        b.lane = lane0 + sub_rows[{lanes[i], depths[i]}];
        row.boxes.push_back(std::move(b));
      }
      lane0 += used;
    }
    row.lanes = std::max(1, lane0);
    // Outer spans first, so the nested ones are drawn over them.
    std::stable_sort(row.boxes.begin(), row.boxes.end(),
                     [](const timeline::SvgBox& a, const timeline::SvgBox& b) {
                       return a.start != b.start ? a.start < b.start : a.end > b.end;
                     });
    rows.push_back(std::move(row));
  }
  timeline::SvgOptions o;
  o.row_height = 18;
  o.target_width = 1400;
  o.subtitle = "one row per rank; sub-rows: the timers (a nested span below its parent), then "
               "each communicator's ops; hover a box for its arguments";
  return timeline::RenderRowsSvg(rows, title, "ms", o);
}

}  // namespace loom::profile
