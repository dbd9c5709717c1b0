// bazel run //train:gpt -- [flags]   (--help lists them all with defaults)
//
// Trains a GPT with tensor, sequence, pipeline and data parallelism. With no
// flags: a ~3M-parameter byte-level GPT on the fortunes corpus, 2 ranks.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/backends.h"
#include "comm/launch/flags.h"
#include "comm/launch/launcher.h"
#include "comm/local/communicator.h"
#include "train/config.h"
#include "train/device_setup.h"
#include "train/gpt_flags.h"
#include "train/trainer.h"

ABSL_DECLARE_FLAG(int, nproc_per_node);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(int64_t, load_iteration);
ABSL_DECLARE_FLAG(int32_t, keep_last);
ABSL_DECLARE_FLAG(bool, async_save);
ABSL_DECLARE_FLAG(bool, no_save_optim);
ABSL_DECLARE_FLAG(std::string, device);

namespace {

constexpr char kUsage[] =
    "Trains a GPT (Megatron-style flags, dashes or underscores):\n"
    "  bazel run //train:gpt -- --tensor-model-parallel-size=2 --nproc-per-node=4 ...\n"
    "With no flags: a small byte-level GPT on the fortunes corpus, 2 ranks.";

// --help shows the trainer's and the launcher's flags, not Abseil's own.
bool IsHelpFile(absl::string_view file) {
  return absl::StrContains(file, "train/gpt_flags.cc") ||
         absl::StrContains(file, "comm/launch/flags.cc");
}

// One rank: validate, build, train, then show a sample of generated text.
// `local_rank`: this rank's index on its node (the GPU it uses without NCCL).
int RunRank(loom::comm::Communicator* world, int local_rank, bool print_errors) {
  using loom::train::TrainConfig;
  TrainConfig config = loom::train::ConfigFromFlags();
  absl::Status valid = loom::train::Finalize(&config, world->size());
  if (valid.ok()) valid = loom::train::SelectDevice(&config, local_rank, world->device());
  if (!valid.ok()) {
    if (print_errors) std::fprintf(stderr, "gpt: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  loom::train::CheckpointFlags ckpt;
  if (absl::GetFlag(FLAGS_load_iteration) >= 0) ckpt.load_iteration = absl::GetFlag(FLAGS_load_iteration);
  ckpt.keep_last = absl::GetFlag(FLAGS_keep_last);
  ckpt.async_save = absl::GetFlag(FLAGS_async_save);
  ckpt.save_optim = !absl::GetFlag(FLAGS_no_save_optim);
  auto trainer = loom::train::Trainer::Create(config, world, nullptr, ckpt);
  absl::Status s = trainer.ok() ? (*trainer)->Train() : trainer.status();
  if (s.ok() && config.sample_tokens > 0 && config.pipeline_model_parallel_size == 1) {
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

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = IsHelpFile;
  usage.contains_helpshort_flags = IsHelpFile;
  absl::SetFlagsUsageConfig(usage);
  // The default job: 2 ranks over UCX (processes) unless told otherwise.
  absl::SetFlag(&FLAGS_nproc_per_node, 2);
  absl::SetFlag(&FLAGS_backend, "");  // ucx, or nccl for --device=cuda (below)
  loom::comm::launch::ParseFlags(argc, argv, kUsage);
  loom::comm::launch::CommFlags comm = loom::comm::launch::GetCommFlags();
  if (!loom::train::BackendFromFlags().empty()) comm.backend = loom::train::BackendFromFlags();
  if (comm.backend.empty()) comm.backend = absl::GetFlag(FLAGS_device) == "cuda" ? "nccl" : "ucx";
  if (loom::train::TimeoutSecondsFromFlags() > 0) comm.timeout_s = loom::train::TimeoutSecondsFromFlags();

  if (comm.backend == "local") {  // ranks are threads of this process
    loom::comm::local::LocalOptions lo;
    lo.comm.timeout = absl::Seconds(comm.timeout_s);
    auto world = loom::comm::local::CreateWorld(comm.nproc_per_node, lo);
    if (!world.ok()) {
      std::fprintf(stderr, "gpt: %s\n", std::string(world.status().message()).c_str());
      return 1;
    }
    std::vector<int> codes(world->size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < world->size(); ++r) {
      threads.emplace_back([&, r] {
        // Each rank thread gets its share of the cores (OpenMP's setting is per thread).
        if (std::getenv("OMP_NUM_THREADS") == nullptr) {
          omp_set_num_threads(std::max<int>(
              1, static_cast<int>(std::thread::hardware_concurrency()) / static_cast<int>(world->size())));
        }
        codes[r] = RunRank((*world)[r].get(), static_cast<int>(r), r == 0);
      });
    }
    for (auto& t : threads) t.join();
    for (int c : codes) {
      if (c != 0) return c;
    }
    return 0;
  }
  // mpirun (or Slurm's srun) starts the ranks itself: never launch under it.
  const bool externally_launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                                   std::getenv("SLURM_NTASKS") != nullptr;
  if (comm.nproc_per_node > 1 && comm.backend != "mpi" && !externally_launched &&
      !loom::comm::launch::IsLaunchedChild()) {
    loom::comm::launch::LaunchOptions lo;
    lo.nproc_per_node = comm.nproc_per_node;
    absl::Status s = loom::comm::launch::LaunchAndWait(lo, argc, argv);
    if (!s.ok()) std::fprintf(stderr, "gpt: %s\n", std::string(s.message()).c_str());
    return s.ok() ? 0 : 1;
  }
  // Ranks sharing a node share its cores: unless the user chose, give each
  // rank its share (oversubscribed OpenMP teams spin against each other).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const int ranks = local != nullptr ? std::max(1, std::atoi(local)) : 1;
    omp_set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks));
  }
  auto world = loom::comm::CreateFromFlags(comm);
  if (!world.ok()) {
    std::fprintf(stderr, "gpt: %s\n", std::string(world.status().message()).c_str());
    return 1;
  }
  const auto info = loom::comm::launch::DiscoverRank(comm.rank);  // as CreateFromFlags did
  const int local_rank = info.ok() ? info->local_rank : (*world)->rank();
  return RunRank(world->get(), local_rank, (*world)->rank() == 0);
}
