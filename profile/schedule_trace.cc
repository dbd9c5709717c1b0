#include "profile/schedule_trace.h"

#include "absl/strings/str_cat.h"
#include "pipeline/timeline_text.h"

namespace loom::profile {

std::vector<RankTrace> ScheduleTrace(const pipeline::Schedule& schedule,
                                     const pipeline::SimResult& result, double us_per_unit) {
  using pipeline::ActionKind;
  std::vector<RankTrace> out;
  for (size_t r = 0; r < result.stages.size(); ++r) {
    RankTrace t;
    t.rank = kPlanPidBase + static_cast<int>(r);
    t.label = absl::StrCat("stage ", r, " (plan: ", pipeline::DescribeSchedule(schedule.options),
                           ")");
    for (const pipeline::TimedAction& ta : result.stages[r].actions) {
      const pipeline::Action& a = ta.action;
      Event e;
      e.ts_us = ta.start * us_per_unit;
      e.dur_us = (ta.end - ta.start) * us_per_unit;
      e.cat = "schedule";
      if (pipeline::IsCompute(a.kind)) {
        e.name = a.kind == ActionKind::kForward ? "forward-compute" : "backward-compute";
        e.track = "main";
        e.args = absl::StrCat("{\"micro_batch\":", a.micro_batch, ",\"chunk\":", a.chunk, "}");
      } else {
        e.name = pipeline::IsSend(a.kind) ? "send" : "recv";
        e.track = "comm pp";
        e.args = absl::StrCat("{\"action\":\"", pipeline::ToShortString(a),
                              "\",\"micro_batch\":", a.micro_batch, ",\"chunk\":", a.chunk,
                              ",\"peer\":", a.peer, "}");
      }
      t.events.push_back(std::move(e));
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace loom::profile
