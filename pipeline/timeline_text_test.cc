#include "pipeline/timeline_text.h"

#include "gtest/gtest.h"

namespace loom::pipeline {
namespace {

Schedule Build(ScheduleKind kind, int pp, int vp, int m) {
  ScheduleOptions o;
  o.kind = kind;
  o.pp = pp;
  o.vp = vp;
  o.micro_batches = m;
  return *BuildSchedule(o);
}

TEST(TimelineTextTest, OneLinePerStage) {
  const Schedule s = Build(ScheduleKind::k1F1B, 2, 1, 3);
  EXPECT_EQ(RenderComputeText(s),
            "stage 0: F0.0 F1.0 B0.0 F2.0 B1.0 B2.0\n"
            "stage 1: F0.0 B0.0 F1.0 B1.0 F2.0 B2.0\n");
}

TEST(TimelineTextTest, ActionsIncludeCommunication) {
  const Schedule s = Build(ScheduleKind::kGPipe, 2, 1, 1);
  EXPECT_EQ(RenderActionsText(s),
            "stage 0: F0.0 SA0.0>1 RG0.0<1 B0.0\n"
            "stage 1: RA0.0<0 F0.0 B0.0 SG0.0>0\n");
}

TEST(TimelineTextTest, InterleavedLinesCarryChunks) {
  const Schedule s = Build(ScheduleKind::kInterleaved, 2, 2, 2);
  const std::string text = RenderComputeText(s);
  EXPECT_EQ(text.substr(0, text.find('\n')),
            "stage 0: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

TEST(TimelineTextTest, SummaryNamesBubbleAndPeaks) {
  const Schedule s = Build(ScheduleKind::kInterleaved, 4, 2, 8);
  const SimResult r = *Simulate(s);
  const std::string text = RenderSummaryText(s, r);
  EXPECT_NE(text.find("interleaved 1F1B, P=4, v=2, M=8, G=4"), std::string::npos) << text;
  EXPECT_NE(text.find("bubble (makespan - ideal) / ideal = 0.1875"), std::string::npos) << text;
  EXPECT_NE(text.find("(P-1)/(v*M) = 0.1875"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 3: busy 48"), std::string::npos) << text;
  EXPECT_DOUBLE_EQ(TheoreticalBubble(s.options), 3.0 / 16);
}

}  // namespace
}  // namespace loom::pipeline
