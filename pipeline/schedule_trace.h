#ifndef LOOM_PIPELINE_SCHEDULE_TRACE_H_
#define LOOM_PIPELINE_SCHEDULE_TRACE_H_

// The plan beside the measurement: a simulated pipeline schedule
// (pipeline/simulator.h) as the traces the profiler writes
// (profile/chrome_trace.h), so that FormatMergedTrace of it opens in Perfetto
// next to a run's trace.json. One process per stage ("stage R (plan: ...)",
// pid kPlanPidBase + R, apart from a run's ranks, so both files' traceEvents
// can be concatenated into one view, e.g. jq -s '{traceEvents:
// (.[0].traceEvents + .[1].traceEvents)}' trace.json plan.json > both.json);
// compute actions are spans named as the trainer's timers name them
// ("forward-compute", "backward-compute", args micro_batch and chunk) on
// "main", point-to-point actions spans "send"/"recv" (args kind, micro_batch,
// chunk, peer) on "comm pp".

#include <vector>

#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "profile/chrome_trace.h"

namespace loom::pipeline {

inline constexpr int kPlanPidBase = 1000;

// `us_per_unit`: microseconds per simulator cost unit.
std::vector<profile::RankTrace> ScheduleTrace(const Schedule& schedule, const SimResult& result,
                                              double us_per_unit = 1000);

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_SCHEDULE_TRACE_H_
