// bazel run //train:gpt -- [flags]   (--help lists them all with defaults)
//
// Trains a GPT with tensor, sequence, pipeline and data parallelism. With no
// flags: a ~3M-parameter byte-level GPT on the fortunes corpus, 2 ranks.
//
// One path for every way of starting: the flags give one TrainConfig
// (train/gpt_flags.cc); comm::launch::RunRanks plans whether this process
// starts the ranks (threads or processes) or is one of them, and runs them;
// the whole configuration is checked against that world before any rank
// starts (its `validate`).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "comm/comm.h"
#include "comm/launch/flags.h"
#include "comm/launch/launcher.h"
#include "comm/launch/plan.h"
#include "comm/launch/run_ranks.h"
#include "config/config.h"
#include "core/cli.h"
#include "plan/auto_layout.h"
#include "train/data/tokenizer.h"
#include "train/device_setup.h"
#include "train/gpt_flags.h"
#include "train/help.h"
#include "train/trainer.h"

// The planner's choice (plan/auto_layout.h). Here, not in gpt_flags.cc:
// //train:plan links those flags and has its own --hardware.
ABSL_FLAG(bool, auto_layout, false,
          "Take the layout (TP, PP, VP, CP, EP, SP, micro-batch, recomputation, distributed "
          "optimizer) from the planner: the fastest that fits on this world's ranks "
          "(row 1 of `bazel run //train:plan` with the same flags); refuses layout flags");
ABSL_FLAG(std::string, hardware, "",
          "--auto-layout's hardware description (plan/hardware.proto text; empty: the built-in "
          "plan/testdata/cpu.textproto, h100_dgx.textproto with --device=cuda)");

namespace {

namespace launch = loom::comm::launch;
using loom::train::TrainConfig;

constexpr char kUsage[] =
    "Trains a GPT (Megatron-style flags, dashes or underscores):\n"
    "  bazel run //train:gpt -- --tensor-model-parallel-size=2 --nproc-per-node=4 ...\n"
    "With no flags: a small byte-level GPT on the fortunes corpus, 2 ranks.";

// The default job's ranks when nobody else started this process.
constexpr int kDefaultNprocPerNode = 2;

// --help shows the trainer's and the launcher's flags, not Abseil's own.
bool IsHelpFile(absl::string_view file) {
  return absl::StrContains(file, "train/gpt_flags.cc") ||
         absl::StrContains(file, "train/gpt_main.cc") ||
         absl::StrContains(file, "comm/launch/flags.cc");
}

// --help: the flags in Megatron's groups, each with the default this job
// runs with. The launcher's flags (comm/launch/flags.cc) serve every binary:
// here no --nproc-per-node starts kDefaultNprocPerNode ranks, and no
// --backend / --distributed-backend means BackendOf's.
std::string Help() {
  const std::string backend = loom::train::BackendOf(TrainConfig{});
  const loom::train::GptHelpText help =
      loom::train::GptHelp(kUsage, IsHelpFile,
                           {{"nproc_per_node", absl::StrCat(kDefaultNprocPerNode)},
                            {"backend", backend},
                            {"distributed_backend", backend}});
  if (!help.problems.empty()) {
    std::fprintf(stderr, "gpt: %s\n",
                 absl::StrReplaceAll(help.problems, {{"\n", "\ngpt: "}}).c_str());
  }
  return help.text;
}

void PrintError(const absl::Status& s) {
  std::fprintf(stderr, "gpt: %s\n", std::string(s.message()).c_str());
}

// How a user runs this binary again, for the commands messages suggest.
std::string ProgramForMessages(const char* argv0) {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");  // set by `bazel run`
  return workspace != nullptr && *workspace != '\0' ? "bazel-bin/train/gpt" : argv0;
}

// Ranks sharing a node share its cores: unless the user chose, give each rank
// (process, or thread: OpenMP's setting is per thread) its share, so OpenMP
// teams do not spin against each other.
void TakeShareOfCores(int ranks_on_node) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  omp_set_num_threads(std::max(
      1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, ranks_on_node)));
}

// One rank: finalize against the real world, build, train, then show a sample
// of generated text. `local_rank`, `local_world_size`: this rank's index and
// the ranks on its node (the GPU it uses without NCCL).
int RunRank(loom::comm::Communicator* world, TrainConfig config, int local_rank,
            int local_world_size, bool print_errors) {
  absl::Status valid = loom::train::Finalize(&config, world->size());
  if (valid.ok()) {
    valid = loom::train::SelectDevice(&config, local_rank, local_world_size, world->device());
  }
  if (!valid.ok()) {
    if (print_errors) PrintError(valid);
    return 2;
  }
  auto trainer = loom::train::Trainer::Create(config, world);
  absl::Status s = trainer.ok() ? (*trainer)->Train() : trainer.status();
  // Stopped early by an --exit-* flag (saved, logged): exit 0, no sample.
  const bool exited =
      s.ok() && (*trainer)->exit_reason() != loom::train::Trainer::ExitReason::kNone;
  if (s.ok() && !exited && !config.skip_train && config.sample_tokens > 0 &&
      config.pipeline_model_parallel_size == 1) {
    const std::string prompt = "The ";
    auto text = (*trainer)->Generate(prompt, config.sample_tokens);
    if (!text.ok()) {
      s = text.status();
    } else if (world->rank() == 0) {
      std::printf("\n--- sample (%lld tokens after \"%s\") ---\n%s%s\n---\n",
                  static_cast<long long>(config.sample_tokens), prompt.c_str(), prompt.c_str(),
                  text->c_str());
      std::fflush(stdout);
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "gpt: rank %d: %s\n", world->rank(), std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

// --auto-layout: the planner's layout for `world_size` ranks, with the typed
// layout flags (`names`) as constraints (plan/auto_layout.h).
absl::StatusOr<loom::plan::AutoLayout> AutoLayout(const TrainConfig& config, int world_size,
                                                  const std::vector<std::string>& names) {
  std::string hardware_name;
  absl::StatusOr<loom::plan::Hardware> hw = loom::plan::AutoLayoutHardware(
      loom::core::ResolveUserPath(absl::GetFlag(FLAGS_hardware)),
      std::string(loom::core::EnumName(config.device)), &hardware_name);
  if (!hw.ok()) return hw.status();
  // The planner sizes the embedding and logits with the tokenizer's vocabulary.
  absl::StatusOr<std::unique_ptr<loom::train::Tokenizer>> tokenizer = loom::train::MakeTokenizer(
      config.tokenizer_type, {config.vocab_file, config.merge_file, config.tokenizer_model});
  if (!tokenizer.ok()) return tokenizer.status();
  TrainConfig sized = config;
  sized.model.vocab_size = (*tokenizer)->vocab_size();
  return loom::plan::ChooseLayout(sized, world_size, *hw, hardware_name,
                                  loom::plan::TypedLayoutFlags(names));
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = IsHelpFile;
  usage.contains_helpshort_flags = IsHelpFile;
  absl::SetFlagsUsageConfig(usage);
  const std::vector<std::string> typed(argv + 1, argv + argc);  // before names are rewritten
  launch::ParseFlags(argc, argv, kUsage, Help);
  TrainConfig config = loom::train::ConfigFromFlags();
  // With --load, the model flags not typed come from the checkpoint.
  std::vector<std::string> with_program = typed;
  with_program.insert(with_program.begin(), argv[0]);
  const std::vector<std::string> names = loom::core::FlagNamesIn(with_program);
  absl::StatusOr<std::string> from_checkpoint = loom::train::ApplyCheckpointModelArgs(
      &config, std::set<std::string>(names.begin(), names.end()));
  if (!from_checkpoint.ok()) {
    PrintError(from_checkpoint.status());
    return 2;
  }
  const launch::CommFlags comm = loom::train::CommFlagsFor(config);

  launch::RunRanksOptions options;
  options.default_nproc_per_node = kDefaultNprocPerNode;
  options.backend_flag = config.distributed_backend_flag;
  options.program = ProgramForMessages(argv[0]);
  options.args = typed;
  options.route_signals = true;  // the trainer's --exit-signal-handler, flight dumps
  // Every check happens before any rank starts, naming the flags. Ranks
  // started by someone else all fail the same way: one message per node.
  bool validate_refused = false;  // its message is printed already (where this process speaks)
  std::vector<std::string> layout_flags;
  options.validate = [&](const launch::LaunchPlan& plan) -> absl::Status {
    const bool is_rank = plan.role == launch::Role::kRank;
    const bool speaks = !is_rank || plan.rank.rank == 0 || plan.rank.local_rank == 0;
    const bool logs = !is_rank || plan.rank.rank == 0;
    absl::Status s;
    // --auto-layout: every process that gets here computes the same choice;
    // the launcher passes it to its ranks as flags (adjust_child_argv).
    if (absl::GetFlag(FLAGS_auto_layout)) {
      absl::StatusOr<loom::plan::AutoLayout> chosen = AutoLayout(config, plan.world_size, names);
      if (chosen.ok()) {
        config = chosen->config;
        layout_flags = chosen->flags;
        if (logs) {
          std::printf("%s\n", chosen->log_line.c_str());
          std::fflush(stdout);
        }
      }
      s = chosen.status();
    }
    if (s.ok() && !from_checkpoint->empty() && logs) {
      std::printf("%s\n", from_checkpoint->c_str());
      std::fflush(stdout);
    }
    TrainConfig checked = config;
    if (s.ok()) s = loom::train::Finalize(&checked, plan.world_size);
    if (s.ok()) {
      s = loom::train::CheckDevice(checked,
                                   is_rank ? plan.rank.local_world_size : plan.nproc_per_node);
    }
    if (!s.ok()) {
      if (speaks) PrintError(s);
      validate_refused = true;
      return s;
    }
    if (!plan.note.empty() && speaks) std::fprintf(stderr, "gpt: note: %s\n", plan.note.c_str());
    return s;
  };
  // A preemption's SIGTERM: the ranks finish the step and save first.
  options.adjust_launch = [&](launch::LaunchOptions* lo) {
    if (config.exit_signal_handler) lo->signal_grace = absl::Seconds(comm.timeout_s);
  };
  // The ranks get the chosen layout as flags (the last of a flag wins): they
  // do not plan again, nor log the choice twice.
  options.adjust_child_argv = [&](std::vector<std::string>* args) {
    if (layout_flags.empty()) return;
    layout_flags.push_back("--auto_layout=false");
    args->insert(std::find(args->begin() + 1, args->end(), std::string("--")),
                 layout_flags.begin(), layout_flags.end());
  };
  // Each rank's exit code (2: refused by its own checks, 1: failed), by local rank.
  std::mutex mu;
  std::map<int, int> codes;
  const launch::RanksOutcome out = launch::RunRanks(
      comm, options, argc, argv,
      [&](loom::comm::Communicator& world, const launch::RankContext& context) {
        TakeShareOfCores(context.local_world_size);
        const int code = RunRank(&world, config, context.local_rank, context.local_world_size,
                                 world.rank() == 0);
        std::lock_guard<std::mutex> lock(mu);
        codes[context.local_rank] = code;
        return code == 0 ? absl::OkStatus() : absl::InternalError("the rank failed (printed)");
      });
  for (const auto& [local_rank, code] : codes) {
    if (code != 0) return code;  // printed by the rank
  }
  if (!out.status.ok() && !validate_refused) PrintError(out.status);
  return out.ExitCode();
}
