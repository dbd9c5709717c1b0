#include "pipeline/timeline_text.h"

#include "absl/strings/str_format.h"

namespace loom::pipeline {
namespace {

std::string Render(const Schedule& schedule, bool with_comm) {
  std::string out;
  for (size_t r = 0; r < schedule.stages.size(); ++r) {
    absl::StrAppendFormat(&out, "stage %d:", r);
    for (const Action& a : schedule.stages[r]) {
      if (with_comm || IsCompute(a.kind)) absl::StrAppend(&out, " ", ToShortString(a));
    }
    out += "\n";
  }
  return out;
}

}  // namespace

std::string RenderComputeText(const Schedule& schedule) { return Render(schedule, false); }
std::string RenderActionsText(const Schedule& schedule) { return Render(schedule, true); }

std::string DescribeSchedule(const ScheduleOptions& o) {
  switch (o.kind) {
    case ScheduleKind::kGPipe:
      return absl::StrFormat("GPipe, P=%d, M=%d", o.pp, o.micro_batches);
    case ScheduleKind::k1F1B:
      return absl::StrFormat("1F1B, P=%d, M=%d", o.pp, o.micro_batches);
    case ScheduleKind::kInterleaved:
      return absl::StrFormat("interleaved 1F1B, P=%d, v=%d, M=%d, G=%d", o.pp, o.vp,
                             o.micro_batches, EffectiveGroupSize(o));
    case ScheduleKind::kZBH1:
      return absl::StrFormat("ZB-H1, P=%d, M=%d", o.pp, o.micro_batches);
    case ScheduleKind::kZBV:
      return absl::StrFormat("ZB-V, P=%d, v=2 (V-shape), M=%d", o.pp, o.micro_batches);
    case ScheduleKind::kDualPipeV:
      return absl::StrFormat("DualPipeV, P=%d, v=2 (V-shape), M=%d", o.pp, o.micro_batches);
  }
  return "?";
}

double TheoreticalBubble(const ScheduleOptions& o) {
  const double p1 = o.pp - 1, m = o.micro_batches;
  switch (o.kind) {
    case ScheduleKind::kZBH1: return p1 / (3 * m);
    case ScheduleKind::kZBV: return p1 / (6 * m);
    // Only the pipeline fill (P − 1)·F, as zbv: every forward's send leaves before the paired
    // backward runs (below DualPipe's table's (PP/2 − 1)(F&B + B − 3W), PP = 2P, which keeps
    // the pair's transfers for its end).
    case ScheduleKind::kDualPipeV: return p1 / (6 * m);
    default: return p1 / (static_cast<double>(o.vp) * m);
  }
}

std::string BubbleFormula(const ScheduleOptions& o) {
  switch (o.kind) {
    case ScheduleKind::kInterleaved: return "(P-1)/(v*M)";
    case ScheduleKind::kZBH1: return "(P-1)/(3M) at F=I=W";
    case ScheduleKind::kZBV:
      return o.micro_batches >= 2 * o.pp - 1 ? "(P-1)/(6M) at F=I=W"
                                             : "(P-1)/(6M) at F=I=W, needs M>=2P-1";
    case ScheduleKind::kDualPipeV: return "(P-1)/(6M) at F=I=W (the fill)";
    default: return "(P-1)/M";
  }
}

std::string RenderSummaryText(const Schedule& schedule, const SimResult& result) {
  std::string out = absl::StrFormat(
      "%s\nmakespan %g, ideal %g, bubble (makespan - ideal) / ideal = %.4f "
      "(textbook %s = %.4f)\n",
      DescribeSchedule(schedule.options), result.makespan, result.ideal, result.bubble_fraction,
      BubbleFormula(schedule.options), TheoreticalBubble(schedule.options));
  for (size_t r = 0; r < result.stages.size(); ++r) {
    const StageTimeline& tl = result.stages[r];
    absl::StrAppendFormat(&out, "stage %d: busy %g, finish %g, peak in-flight activations %d\n",
                          r, tl.busy, tl.finish, tl.peak_activations);
  }
  return out;
}

}  // namespace loom::pipeline
