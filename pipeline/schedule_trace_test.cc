#include "pipeline/schedule_trace.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "profile/chrome_trace.h"
#include "profile/trace_svg.h"

namespace loom::pipeline {
namespace {

// The plan as the profiler's trace format, parsed back and drawn by
// //profile:timeline_svg's renderer (moved here from profile/chrome_trace_test
// when the plan's trace moved to //pipeline, #36).
TEST(ScheduleTraceTest, PlanAndSvgOfASimulatedSchedule) {
  ScheduleOptions so;
  so.kind = ScheduleKind::k1F1B;
  so.pp = 2;
  so.micro_batches = 4;
  absl::StatusOr<Schedule> s = BuildSchedule(so);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<SimResult> r = Simulate(*s);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<profile::RankTrace> plan = ScheduleTrace(*s, *r, 100);
  ASSERT_EQ(plan.size(), 2u);
  absl::StatusOr<profile::ParsedTrace> t =
      profile::ParseTrace(profile::FormatMergedTrace(plan), "plan");
  ASSERT_TRUE(t.ok()) << t.status();
  int forwards = 0, backwards = 0;
  for (const profile::Event& e : t->events) {
    if (e.name == "forward-compute") {
      ++forwards;
      EXPECT_DOUBLE_EQ(e.dur_us, 100);
    }
    if (e.name == "backward-compute") {
      ++backwards;
      EXPECT_DOUBLE_EQ(e.dur_us, 200);
    }
  }
  EXPECT_EQ(forwards, 8);
  EXPECT_EQ(backwards, 8);
  ASSERT_EQ(t->processes.size(), 2u);
  EXPECT_EQ(t->processes[0].second.rfind("stage 0 (plan", 0), 0u) << t->processes[0].second;

  const std::string svg = profile::RenderTraceSvg(*t, "plan");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  size_t boxes = 0;
  for (size_t at = 0; (at = svg.find("class=\"box\"", at)) != std::string::npos; ++at) ++boxes;
  EXPECT_EQ(boxes, t->events.size());
  EXPECT_NE(svg.find("data-name=\"backward-compute\""), std::string::npos);
  EXPECT_NE(svg.find("stage 1 (plan"), std::string::npos);
}

}  // namespace
}  // namespace loom::pipeline
