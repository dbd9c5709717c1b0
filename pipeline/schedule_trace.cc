#include "pipeline/schedule_trace.h"

#include "absl/strings/str_cat.h"
#include "pipeline/timeline_text.h"

namespace loom::pipeline {

std::vector<profile::RankTrace> ScheduleTrace(const Schedule& schedule, const SimResult& result,
                                              double us_per_unit) {
  std::vector<profile::RankTrace> out;
  for (size_t r = 0; r < result.stages.size(); ++r) {
    profile::RankTrace t;
    t.rank = kPlanPidBase + static_cast<int>(r);
    t.label = absl::StrCat("stage ", r, " (plan: ", DescribeSchedule(schedule.options), ")");
    for (const TimedAction& ta : result.stages[r].actions) {
      const Action& a = ta.action;
      profile::Event e;
      e.ts_us = ta.start * us_per_unit;
      e.dur_us = (ta.end - ta.start) * us_per_unit;
      e.cat = "schedule";
      if (IsCompute(a.kind)) {
        e.name = a.kind == ActionKind::kForward ? "forward-compute" : "backward-compute";
        e.track = "main";
        e.args = absl::StrCat("{\"micro_batch\":", a.micro_batch, ",\"chunk\":", a.chunk, "}");
      } else {
        e.name = IsSend(a.kind) ? "send" : "recv";
        e.track = "comm pp";
        e.args = absl::StrCat("{\"action\":\"", ToShortString(a),
                              "\",\"micro_batch\":", a.micro_batch, ",\"chunk\":", a.chunk,
                              ",\"peer\":", a.peer, "}");
      }
      t.events.push_back(std::move(e));
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace loom::pipeline
