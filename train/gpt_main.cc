// bazel run //train:gpt -- [flags]   (--help lists them all with defaults)
//
// Trains a GPT with tensor, sequence, pipeline and data parallelism. With no
// flags: a ~3M-parameter byte-level GPT on the fortunes corpus, 2 ranks.
//
// One path for every way of starting: the flags give one TrainConfig
// (train/gpt_flags.cc); comm::launch::PlanLaunch says whether this process
// starts the ranks (threads or processes) or is one of them; the whole
// configuration is checked against that world before any rank starts.
#include <omp.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "comm/backends.h"
#include "comm/launch/flags.h"
#include "comm/launch/launcher.h"
#include "comm/launch/plan.h"
#include "comm/local/communicator.h"
#include "config/config.h"
#include "core/cli.h"
#include "core/signal_thread.h"
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

// --distributed-backend=local: the ranks are threads of this process.
int RunThreads(const TrainConfig& config, const launch::CommFlags& comm, int n) {
  loom::comm::local::LocalOptions lo;
  lo.comm.timeout = absl::Seconds(comm.timeout_s);
  lo.comm.flight_recorder_dir = comm.flight_recorder_dir;
  lo.comm.flight_recorder_entries = comm.flight_recorder_entries;
  auto world = loom::comm::local::CreateWorld(n, lo);
  if (!world.ok()) {
    PrintError(world.status());
    return 1;
  }
  std::vector<int> codes(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TakeShareOfCores(n);
      codes[r] = RunRank((*world)[r].get(), config, r, n, r == 0);
    });
  }
  for (auto& t : threads) t.join();
  for (int c : codes) {
    if (c != 0) return c;
  }
  return 0;
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

  // Every check happens here, before any rank starts, naming the flags.
  absl::Status s = loom::comm::CheckCommFlags(comm, config.distributed_backend_flag);
  if (!s.ok()) {
    PrintError(s);
    return 2;
  }
  s = launch::CheckAgentFlags(comm);
  if (!s.ok()) {
    PrintError(s);
    return 2;
  }
  launch::LaunchRequest request = launch::LaunchRequestFor(comm);
  request.backend_flag = config.distributed_backend_flag;
  request.default_nproc_per_node = kDefaultNprocPerNode;
  request.program = ProgramForMessages(argv[0]);
  request.args = typed;
  absl::StatusOr<launch::LaunchPlan> plan = launch::PlanLaunch(request);
  if (!plan.ok()) {
    PrintError(plan.status());
    return 2;
  }
  const bool is_rank = plan->role == launch::Role::kRank;
  // A rank takes SIGTERM (preemption, the agent's forward) and SIGUSR1 (a
  // flight-recorder dump) on an idle thread, never mid-computation: set
  // before this process starts any thread. (The launcher handles its own.)
  if (plan->role != launch::Role::kLauncher) {
    loom::core::RouteSignalsToOwnThread({SIGTERM, SIGUSR1});
  }
  // Ranks started by someone else all fail the same way: one message per node.
  const bool speaks = !is_rank || plan->rank.rank == 0 || plan->rank.local_rank == 0;
  // --auto-layout: every process that gets here computes the same choice
  // (plan/auto_layout.h), with the typed layout flags as constraints; the
  // launcher passes it to its ranks as flags.
  std::vector<std::string> layout_flags;
  if (absl::GetFlag(FLAGS_auto_layout)) {
    std::string hardware_name;
    absl::StatusOr<loom::plan::Hardware> hw = loom::plan::AutoLayoutHardware(
        loom::core::ResolveUserPath(absl::GetFlag(FLAGS_hardware)), config.device, &hardware_name);
    // The planner sizes the embedding and logits with the tokenizer's vocabulary.
    absl::StatusOr<std::unique_ptr<loom::train::Tokenizer>> tokenizer =
        hw.ok() ? loom::train::MakeTokenizer(
                      config.tokenizer_type,
                      {config.vocab_file, config.merge_file, config.tokenizer_model})
                : absl::StatusOr<std::unique_ptr<loom::train::Tokenizer>>(hw.status());
    if (tokenizer.ok()) config.model.vocab_size = (*tokenizer)->vocab_size();
    absl::StatusOr<loom::plan::AutoLayout> chosen =
        tokenizer.ok() ? loom::plan::ChooseLayout(config, plan->world_size, *hw, hardware_name,
                                                  loom::plan::TypedLayoutFlags(names))
                       : absl::StatusOr<loom::plan::AutoLayout>(tokenizer.status());
    if (!chosen.ok()) {
      if (speaks) PrintError(chosen.status());
      return 2;
    }
    config = chosen->config;
    layout_flags = chosen->flags;
    if (!is_rank || plan->rank.rank == 0) {
      std::printf("%s\n", chosen->log_line.c_str());
      std::fflush(stdout);
    }
  }
  if (!from_checkpoint->empty() && (!is_rank || plan->rank.rank == 0)) {
    std::printf("%s\n", from_checkpoint->c_str());
    std::fflush(stdout);
  }
  TrainConfig checked = config;
  s = loom::train::Finalize(&checked, plan->world_size);
  if (s.ok()) {
    s = loom::train::CheckDevice(
        checked, is_rank ? plan->rank.local_world_size : plan->nproc_per_node);
  }
  if (!s.ok()) {
    if (speaks) PrintError(s);
    return 2;
  }
  if (!plan->note.empty() && speaks) std::fprintf(stderr, "gpt: note: %s\n", plan->note.c_str());

  switch (plan->role) {
    case launch::Role::kThreads:
      return RunThreads(config, comm, plan->nproc_per_node);
    case launch::Role::kLauncher: {
      launch::LaunchOptions lo = launch::LaunchOptionsFor(comm, *plan);
      // A preemption's SIGTERM: the ranks finish the step and save first.
      if (config.exit_signal_handler) lo.signal_grace = absl::Seconds(comm.timeout_s);
      // The ranks get the chosen layout as flags (the last of a flag wins):
      // they do not plan again, nor log the choice twice.
      std::vector<std::string> args(argv, argv + argc);
      if (!layout_flags.empty()) {
        auto end = std::find(args.begin() + 1, args.end(), std::string("--"));
        layout_flags.push_back("--auto_layout=false");
        args.insert(end, layout_flags.begin(), layout_flags.end());
      }
      std::vector<char*> child_argv;
      for (std::string& a : args) child_argv.push_back(a.data());
      child_argv.push_back(nullptr);
      s = launch::LaunchAndWait(lo, static_cast<int>(args.size()), child_argv.data());
      if (!s.ok()) PrintError(s);
      return s.ok() ? 0 : 1;
    }
    case launch::Role::kRank:
      break;
  }
  TakeShareOfCores(plan->rank.local_world_size);
  auto world = loom::comm::CreateFromFlags(comm, plan->rank);
  if (!world.ok()) {
    PrintError(world.status());
    return 1;
  }
  return RunRank(world->get(), config, plan->rank.local_rank, plan->rank.local_world_size,
                 (*world)->rank() == 0);
}
