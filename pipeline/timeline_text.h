#ifndef LOOM_PIPELINE_TIMELINE_TEXT_H_
#define LOOM_PIPELINE_TIMELINE_TEXT_H_

#include <string>

#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace loom::pipeline {

// One line per stage with its compute actions in order, "F<micro-batch>.<chunk>":
//   stage 0: F0.0 F1.0 F2.0 F3.0 B0.0 ...
// (split backward: I<m>.<c> for BackwardInput, W<m>.<c> for BackwardWeight).
std::string RenderComputeText(const Schedule& schedule);

// The same with the communication actions ("RA0.0<0 F0.0 SA0.0>2 ..."); see ToShortString.
std::string RenderActionsText(const Schedule& schedule);

// A few lines of simulation results: makespan, ideal, bubble fraction and its closed form,
// and per stage the busy time and the peak number of in-flight activations.
std::string RenderSummaryText(const Schedule& schedule, const SimResult& result);

// "interleaved 1F1B, P=4, v=2, M=8": the schedule in words, for titles.
std::string DescribeSchedule(const ScheduleOptions& options);

// The textbook bubble fraction: (P−1)/M, or (P−1)/(v·M) for interleaved; for the zero-bubble
// schedules at F = I = W (Qi et al.'s assumption): zb-h1 (P−1)/(3M) (Table 1's
// (P−1)(T_F + T_B − T_W)), zbv (P−1)/(6M), the pipeline fill alone (for M >= 2P − 1).
double TheoreticalBubble(const ScheduleOptions& options);
// That formula as text for titles: "(P-1)/M", "(P-1)/(3M) at F=I=W", ...
std::string BubbleFormula(const ScheduleOptions& options);

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_TIMELINE_TEXT_H_
