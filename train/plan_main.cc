// bazel run //train:plan -- <the model flags of //train:gpt> --gpus=N
//   (or --nproc-per-node and --nnodes) --hardware=FILE --global-batch-size=B
// Lists every valid layout with its predicted memory per rank and step time,
// fastest first among those that fit. --explain shows the formulas for one.
// --calibrate measures this machine and prints a hardware file.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "google/protobuf/text_format.h"
#include "comm/launch/flags.h"
#include "core/cli.h"
#include "plan/calibrate.h"
#include "plan/hardware.h"
#include "plan/layout.h"
#include "plan/report.h"
#include "train/device_setup.h"
#include "train/gpt_flags.h"

ABSL_FLAG(int, gpus, 0, "Ranks to plan for (0: --nproc-per-node x --nnodes)");
ABSL_FLAG(std::string, hardware, "", "Hardware description, protobuf text (plan/hardware.proto)");
ABSL_FLAG(int64_t, vocab_size, 0,
          "Vocabulary size (0: the model's default; //train:gpt takes it from the tokenizer)");
ABSL_FLAG(bool, explain, false, "Show the formulas with their numbers for one layout");
ABSL_FLAG(int, explain_rank, 1, "Which listed layout --explain shows (1: the fastest that fits)");
ABSL_FLAG(int, top, 25, "Rows to print (0: all)");
ABSL_FLAG(int, max_context_parallel_size, 1, "Try context parallelism up to this size");
ABSL_FLAG(int, max_tensor_parallel_size, 0, "Try TP up to this size (0: devices per node)");
ABSL_FLAG(int64_t, max_micro_batch_size, 8, "Try micro-batch sizes 1, 2, 4, ... up to this");
ABSL_FLAG(bool, calibrate, false,
          "Measure this machine (GEMM sizes, memcpy, the local backend's collectives) and print "
          "a hardware file; with --device=cuda [--bf16] --hardware=BASE: BASE with the GEMM "
          "curve and memory bandwidth measured on the GPU");

namespace {
// `bazel run` starts binaries in their runfiles: a relative --hardware is
// taken from where the user ran it (as core::ResolveUserPath does for //train:gpt).
std::string UserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

// --calibrate --device=cuda [--bf16] --hardware=BASE: BASE with the GEMM curve
// and memory bandwidth measured on this rank's GPU (plan/calibrate.h).
int CalibrateDevice() {
  loom::train::TrainConfig config = loom::train::ConfigFromFlags();
  const std::string path = UserPath(absl::GetFlag(FLAGS_hardware));
  if (path.empty()) {
    std::fprintf(stderr,
                 "plan: --calibrate --device=cuda needs --hardware=FILE: the datasheet description "
                 "whose peak_flops the measured curve is relative to and whose links it keeps "
                 "(e.g. plan/testdata/h100_dgx.textproto)\n");
    return 2;
  }
  absl::StatusOr<loom::plan::Hardware> base = loom::plan::LoadHardware(path);
  if (!base.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(base.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = loom::train::SelectDevice(&config, 0, 1); !s.ok()) {
    std::fprintf(stderr, "plan: --calibrate --device=cuda: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::StatusOr<loom::plan::Hardware> hw = loom::plan::CalibrateDevice(
      *base, config.model.device, config.bf16 ? loom::core::DType::kBF16 : loom::core::DType::kF32,
      loom::plan::DeviceGemmShapes(), int64_t{1} << 30);
  std::string text;
  if (!hw.ok() || !google::protobuf::TextFormat::PrintToString(*hw, &text)) {
    std::fprintf(stderr, "plan: --calibrate --device=cuda: %s\n",
                 hw.ok() ? "cannot print the result" : std::string(hw.status().message()).c_str());
    return 1;
  }
  std::printf("# Measured by `//train:plan -- --calibrate --device=cuda%s --hardware=%s`\n"
              "# (plan/calibrate.h): GEMM curve and memory bandwidth; the rest is that file's.\n%s",
              config.bf16 ? " --bf16" : "", absl::GetFlag(FLAGS_hardware).c_str(), text.c_str());
  return 0;
}

constexpr char kUsage[] =
    "bazel run //train:plan -- <model flags of //train:gpt> --gpus=N --hardware=FILE "
    "--global-batch-size=B [--explain] | --calibrate [--device=cuda [--bf16] --hardware=BASE]";
}  // namespace

int main(int argc, char** argv) {
  // The layout flags typed (before ParseFlags rewrites the names) are
  // constraints, as for //train:gpt --auto-layout.
  const std::set<std::string> fixed = loom::plan::TypedLayoutFlags(
      loom::core::FlagNamesIn(std::vector<std::string>(argv, argv + argc)));
  loom::comm::launch::ParseFlags(argc, argv, kUsage);
  if (absl::GetFlag(FLAGS_calibrate) &&
      loom::train::ConfigFromFlags().device == loom::train::DeviceKind::kCuda) {
    return CalibrateDevice();
  }
  if (absl::GetFlag(FLAGS_calibrate)) {
    absl::StatusOr<std::string> text = loom::plan::Calibrate();
    if (!text.ok()) {
      std::fprintf(stderr, "plan: %s\n", std::string(text.status().message()).c_str());
      return 1;
    }
    std::printf("%s", text->c_str());
    return 0;
  }
  loom::train::TrainConfig config = loom::train::ConfigFromFlags();
  if (absl::GetFlag(FLAGS_vocab_size) > 0) config.model.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  const loom::comm::launch::CommFlags comm = loom::comm::launch::GetCommFlags();
  int gpus = absl::GetFlag(FLAGS_gpus);
  if (gpus <= 0) gpus = comm.nproc_per_node * comm.nnodes;
  const std::string path = UserPath(absl::GetFlag(FLAGS_hardware));
  if (path.empty()) {
    std::fprintf(stderr, "plan: --hardware=FILE is required (plan/testdata/cpu.textproto, "
                         "h100_dgx.textproto, a100_dgx.textproto; or --calibrate)\n");
    return 2;
  }
  absl::StatusOr<loom::plan::Hardware> hw = loom::plan::LoadHardware(path);
  if (!hw.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(hw.status().message()).c_str());
    return 2;
  }
  loom::plan::SearchOptions search;
  search.gpus = gpus;
  search.devices_per_node = hw->devices_per_node();
  search.max_tp = absl::GetFlag(FLAGS_max_tensor_parallel_size);
  search.max_cp = absl::GetFlag(FLAGS_max_context_parallel_size);
  search.max_micro_batch = absl::GetFlag(FLAGS_max_micro_batch_size);
  search.fixed = fixed;
  loom::plan::TimeOptions time;
  // //train:gpt's --tp-comm-overlap: the time model hides the forward's TP communication
  // behind the GEMMs, and TP layouts without --sequence-parallel are refused as gpt would.
  time.tp_comm_overlap = config.tp_comm_overlap;
  int rejected = 0;
  std::string first_error;
  absl::StatusOr<std::vector<loom::plan::Planned>> plans =
      loom::plan::PlanAll(config, *hw, search, time, &rejected, &first_error);
  if (!plans.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(plans.status().message()).c_str());
    return 1;
  }
  const std::string typed = loom::plan::FixedFlags(config, fixed);
  if (plans->empty()) {  // bad flags (as typed): nothing to list
    std::fprintf(stderr,
                 "plan: no layout%s is valid on %d ranks; the trainer's first refusal: %s\n",
                 typed.empty() ? "" : (" with " + typed).c_str(), gpus, first_error.c_str());
    return 2;
  }
  int fit = 0;
  for (const auto& p : *plans) fit += p.fits;
  std::printf(
      "%zu valid layouts on %d ranks%s (%d candidates refused by the trainer's checks), "
      "%d fit in memory; fastest first:\n",
      plans->size(), gpus, typed.empty() ? "" : (" with " + typed).c_str(), rejected, fit);
  std::printf("%s", loom::plan::FormatTable(*plans, *hw, absl::GetFlag(FLAGS_top)).c_str());
  std::printf("\n%s", loom::plan::WhyTheyLose(*plans, *hw, std::min<size_t>(
                                                        absl::GetFlag(FLAGS_top) > 0
                                                            ? absl::GetFlag(FLAGS_top)
                                                            : plans->size(),
                                                        10)).c_str());
  if (absl::GetFlag(FLAGS_explain) && !plans->empty()) {
    const size_t k = std::min<size_t>(plans->size(),
                                      std::max(1, absl::GetFlag(FLAGS_explain_rank))) - 1;
    std::printf("\n--explain (row %zu)\n%s", k + 1, loom::plan::Explain((*plans)[k], *hw).c_str());
  }
  return 0;
}
