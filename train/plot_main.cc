// bazel run //train:plot -- --metrics-file=metrics.jsonl --out=loss.svg
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "core/cli.h"
#include "train/loss_plot.h"

ABSL_FLAG(std::string, metrics_file, "", "JSON-lines metrics written by //train:gpt --metrics-file");
ABSL_FLAG(std::string, out, "loss.svg", "Output SVG");
ABSL_FLAG(std::string, title, "Loom GPT training loss", "Chart title");

using loom::core::ResolveUserPath;

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Draws the loss curve of a training run as SVG.");
  loom::core::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  auto curve = loom::train::ReadMetrics(ResolveUserPath(absl::GetFlag(FLAGS_metrics_file)));
  if (!curve.ok()) {
    std::fprintf(stderr, "plot: %s\n", std::string(curve.status().message()).c_str());
    return 1;
  }
  const std::string out = ResolveUserPath(absl::GetFlag(FLAGS_out));
  std::ofstream(out) << loom::train::RenderLossSvg(*curve, absl::GetFlag(FLAGS_title));
  std::printf("wrote %s (%zu training points, %zu validation points)\n", out.c_str(),
              curve->train.size(), curve->valid.size());
  return 0;
}
