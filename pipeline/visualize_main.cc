// Draws a pipeline schedule's simulated timeline as SVG, or prints it as text.
//
//   bazel run //pipeline:visualize -- --schedule=interleaved --pp=4 --vpp=2
//       --micro-batches=8 --out=schedule.svg   (one line)
//   bazel run //pipeline:visualize -- --schedule=1f1b --pp=4 --micro-batches=8 --format=text
//   bazel run //pipeline:visualize -- --schedule=1f1b --pp=4 --format=chrome --us-per-unit=2000
//       --out=plan.json   (a Chrome trace, like --profile's trace.json: plan beside reality)
//
// Flag names may be written with dashes or underscores (--micro-batches, --micro_batches).
// A relative --out is resolved against the directory `bazel run` was started from.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/cli.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_trace.h"
#include "pipeline/simulator.h"
#include "pipeline/timeline_svg.h"
#include "pipeline/timeline_text.h"
#include "profile/chrome_trace.h"
#include "timeline/svg.h"

ABSL_FLAG(std::string, schedule, "1f1b",
          "pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 | zbv | dualpipev (zbv and "
          "dualpipev need --vpp=2)");
ABSL_FLAG(int, pp, 4, "pipeline stages P (--pipeline-model-parallel-size)");
ABSL_FLAG(int, vpp, 1,
          "model chunks per stage v (--virtual-pipeline-model-parallel-size); interleaved only");
ABSL_FLAG(int, micro_batches, 8, "micro-batches per step M");
ABSL_FLAG(int, microbatch_group_size_per_virtual_pipeline_stage, 0,
          "interleaved micro-batch group size G; 0 means P. Must lie in [P, M] and divide M");
ABSL_FLAG(double, forward_cost, 1.0, "cost of one chunk's forward (f)");
ABSL_FLAG(double, backward_cost, 2.0, "cost of one chunk's backward (b)");
ABSL_FLAG(double, backward_input_cost, 1.0,
          "zb-h1 / zbv / dualpipev: cost of one chunk's input-gradient backward (I, the paper's B)");
ABSL_FLAG(double, backward_weight_cost, 1.0,
          "zb-h1 / zbv / dualpipev: cost of one chunk's weight-gradient backward (W)");
ABSL_FLAG(double, comm_cost, 0.0, "cost of one point-to-point transfer");
ABSL_FLAG(std::string, comm_mode, "eager",
          "eager (buffered sends) | rendezvous (sends wait for the receive)");
ABSL_FLAG(std::string, format, "svg",
          "svg | text (compute order + summary) | actions (with sends/receives) | chrome (trace-"
          "event JSON, as //train:gpt --profile writes: Perfetto, chrome://tracing)");
ABSL_FLAG(double, us_per_unit, 1000,
          "--format=chrome: microseconds per cost unit (e.g. a measured forward-compute in us "
          "with --forward-cost=1)");
ABSL_FLAG(std::string, out, "", "output file; empty writes to stdout");

namespace {

namespace lp = loom::pipeline;

int Fail(const std::string& message) {
  std::fprintf(stderr, "visualize: error: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Draws a pipeline schedule's timeline.\n  visualize --schedule=interleaved --pp=4 --vpp=2 "
      "--micro-batches=8 --out=schedule.svg");
  loom::core::NormalizedArgv args(argc, argv);  // --micro-batches as well as --micro_batches
  std::vector<char*> rest = absl::ParseCommandLine(args.argc(), args.argv());
  if (rest.size() > 1) {
    return Fail(absl::StrFormat("unexpected argument '%s' (flags look like --pp=4)", rest[1]));
  }

  absl::StatusOr<lp::ScheduleKind> kind = lp::ParseScheduleKind(absl::GetFlag(FLAGS_schedule));
  if (!kind.ok()) {
    return Fail(absl::StrFormat("--schedule='%s' is not a schedule; expected one of %s",
                                absl::GetFlag(FLAGS_schedule),
                                loom::core::EnumChoices<lp::ScheduleKind>()));
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "svg" && format != "text" && format != "actions" && format != "chrome") {
    return Fail(absl::StrFormat("--format='%s': expected svg, text, actions or chrome", format));
  }
  if (!(absl::GetFlag(FLAGS_us_per_unit) > 0)) {
    return Fail(absl::StrFormat("--us-per-unit=%g: must be > 0", absl::GetFlag(FLAGS_us_per_unit)));
  }
  const std::string comm_mode = absl::GetFlag(FLAGS_comm_mode);
  if (comm_mode != "eager" && comm_mode != "rendezvous") {
    return Fail(absl::StrFormat("--comm-mode='%s': expected eager or rendezvous", comm_mode));
  }
  if (absl::GetFlag(FLAGS_forward_cost) <= 0 || absl::GetFlag(FLAGS_backward_cost) <= 0 ||
      absl::GetFlag(FLAGS_backward_input_cost) <= 0 ||
      absl::GetFlag(FLAGS_backward_weight_cost) <= 0 || absl::GetFlag(FLAGS_comm_cost) < 0) {
    return Fail(
        "--forward-cost, --backward-cost, --backward-input-cost and --backward-weight-cost must "
        "be > 0 and --comm-cost >= 0");
  }

  lp::ScheduleOptions so;
  so.kind = *kind;
  so.pp = absl::GetFlag(FLAGS_pp);
  so.vp = absl::GetFlag(FLAGS_vpp);
  so.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  so.microbatch_group_size = absl::GetFlag(FLAGS_microbatch_group_size_per_virtual_pipeline_stage);
  absl::StatusOr<lp::Schedule> schedule = lp::BuildSchedule(so);
  if (!schedule.ok()) return Fail(std::string(schedule.status().message()));

  lp::SimOptions sim;
  sim.forward_cost = absl::GetFlag(FLAGS_forward_cost);
  sim.backward_cost = absl::GetFlag(FLAGS_backward_cost);
  sim.comm_cost = absl::GetFlag(FLAGS_comm_cost);
  sim.backward_input_cost = absl::GetFlag(FLAGS_backward_input_cost);
  sim.backward_weight_cost = absl::GetFlag(FLAGS_backward_weight_cost);
  sim.comm_mode = comm_mode == "eager" ? lp::CommMode::kEager : lp::CommMode::kRendezvous;
  absl::StatusOr<lp::SimResult> result = lp::Simulate(*schedule, sim);
  if (!result.ok()) return Fail(std::string(result.status().message()));

  std::string text;
  if (format == "svg") {
    loom::timeline::SvgOptions svg;
    svg.subtitle = absl::StrFormat(
        "f=%g, b=%g, comm=%g (%s); light = forward, dark hatched = backward; "
        "label = micro-batch.chunk",
        sim.forward_cost, sim.backward_cost, sim.comm_cost, comm_mode);
    text = lp::RenderTimelineSvg(*schedule, *result, svg);
  } else if (format == "chrome") {
    text = loom::profile::FormatMergedTrace(
        lp::ScheduleTrace(*schedule, *result, absl::GetFlag(FLAGS_us_per_unit)));
  } else if (format == "text") {
    text = lp::RenderComputeText(*schedule) + lp::RenderSummaryText(*schedule, *result);
  } else {
    text = lp::RenderActionsText(*schedule);
  }

  const std::string out = loom::core::ResolveUserPath(absl::GetFlag(FLAGS_out));
  if (out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::ofstream file(out, std::ios::binary);
  file << text;
  file.close();
  if (!file) return Fail(absl::StrFormat("--out=%s: cannot write '%s'", absl::GetFlag(FLAGS_out), out));
  std::fprintf(stderr, "wrote %s (bubble %.4f, makespan %g)\n", out.c_str(),
               result->bubble_fraction, result->makespan);
  return 0;
}
