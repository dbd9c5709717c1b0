// bazel run //checkpoint:convert -- --load=DIR [--load-iteration=N] --save=OUT
//     --target-tensor-parallel-size=T --target-pipeline-parallel-size=P
//
// Rewrites a checkpoint as if saved by a TP T x PP P run. (Any Loom run can
// load any checkpoint directly; this makes the files match a layout, e.g.
// one file per rank for a cluster without a shared file system.)
#include <cstdio>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "checkpoint/convert.h"
#include "checkpoint/reader.h"
#include "core/cli.h"

ABSL_FLAG(std::string, load, "", "Checkpoint folder to read (uses its `latest`)");
ABSL_FLAG(int64_t, load_iteration, -1, "Iteration to read (-1: the one `latest` names)");
ABSL_FLAG(std::string, save, "", "Folder to write the converted checkpoint to");
ABSL_FLAG(int32_t, target_tensor_parallel_size, 1, "TP degree of the output");
ABSL_FLAG(int32_t, target_pipeline_parallel_size, 1, "PP degree of the output");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Reshards a Loom checkpoint: --load=DIR --save=OUT --target-tensor-parallel-size=T "
      "--target-pipeline-parallel-size=P");
  loom::core::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  const std::string load = absl::GetFlag(FLAGS_load), save = absl::GetFlag(FLAGS_save);
  if (load.empty() || save.empty()) {
    std::fprintf(stderr, "convert: --load and --save are required\n");
    return 2;
  }
  if (load == save) {
    std::fprintf(stderr, "convert: --save must differ from --load (nothing is overwritten)\n");
    return 2;
  }
  std::optional<int64_t> it;
  if (absl::GetFlag(FLAGS_load_iteration) >= 0) it = absl::GetFlag(FLAGS_load_iteration);
  auto path = loom::checkpoint::ResolveCheckpoint(load, it);
  absl::Status s = path.ok() ? loom::checkpoint::ConvertCheckpoint(
                                   *path, save, absl::GetFlag(FLAGS_target_tensor_parallel_size),
                                   absl::GetFlag(FLAGS_target_pipeline_parallel_size))
                             : path.status();
  if (!s.ok()) {
    std::fprintf(stderr, "convert: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("convert: wrote %s (TP %d x PP %d) from %s\n", save.c_str(),
              absl::GetFlag(FLAGS_target_tensor_parallel_size),
              absl::GetFlag(FLAGS_target_pipeline_parallel_size), path->c_str());
  return 0;
}
