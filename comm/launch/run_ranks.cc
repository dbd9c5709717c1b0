#include "comm/launch/run_ranks.h"

#include <algorithm>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/backend_registry.h"
#include "comm/backends.h"
#include "comm/launch/launcher.h"
#include "comm/store/memory_store.h"
#include "core/signal_thread.h"

namespace loom::comm::launch {
namespace {

// kThreads: every thread creates its rank through the backend's factory (the
// ranks meet in one MemoryStore), then runs `fn`.
absl::Status RunThreads(const CommFlags& flags, int n, const RankFn& fn) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      BackendOptions o;
      o.rank = r;
      o.world_size = n;
      o.store = store;
      o.network = flags.network;
      o.comm.timeout = absl::Seconds(flags.timeout_s);
      o.comm.flight_recorder_dir = flags.flight_recorder_dir;
      o.comm.flight_recorder_entries = flags.flight_recorder_entries;
      absl::StatusOr<std::unique_ptr<Communicator>> world = Create(flags.backend, o);
      results[r] = world.ok() ? fn(**world, RankContext{r, n, n > 1}) : world.status();
    });
  }
  for (std::thread& t : threads) t.join();
  absl::Status status;
  for (const absl::Status& s : results) status.Update(s);
  return status;
}

}  // namespace

RanksOutcome RunRanks(const CommFlags& flags, const RunRanksOptions& options, int argc,
                      char** argv, const RankFn& rank_fn) {
  RanksOutcome out;
  out.status = CheckCommFlags(flags, options.backend_flag);
  if (out.status.ok()) out.status = CheckAgentFlags(flags);
  if (!out.status.ok()) return out;
  LaunchRequest request = LaunchRequestFor(flags);
  request.backend_flag = options.backend_flag;
  request.default_nproc_per_node = options.default_nproc_per_node;
  request.program = !options.program.empty() ? options.program : (argc > 0 ? argv[0] : "");
  request.args = !options.args.empty() ? options.args
                                       : std::vector<std::string>(argv + std::min(argc, 1),
                                                                  argv + argc);
  absl::StatusOr<LaunchPlan> plan = PlanLaunch(request);
  if (!plan.ok()) {
    out.status = plan.status();
    return out;
  }
  out.role = plan->role;
  if (options.route_signals && plan->role != Role::kLauncher) {
    core::RouteSignalsToOwnThread({SIGTERM, SIGUSR1});
  }
  if (options.validate) out.status = options.validate(*plan);
  if (!out.status.ok()) return out;
  out.started = true;
  switch (plan->role) {
    case Role::kLauncher: {
      LaunchOptions lo = LaunchOptionsFor(flags, *plan);
      if (options.adjust_launch) options.adjust_launch(&lo);
      std::vector<std::string> args(argv, argv + argc);
      if (options.adjust_child_argv) options.adjust_child_argv(&args);
      std::vector<char*> child_argv;
      for (std::string& a : args) child_argv.push_back(a.data());
      child_argv.push_back(nullptr);
      out.status = LaunchAndWait(lo, static_cast<int>(args.size()), child_argv.data());
      return out;
    }
    case Role::kThreads:
      out.status = RunThreads(flags, plan->nproc_per_node, rank_fn);
      return out;
    case Role::kRank:
      break;
  }
  SetRestartCount(plan->rank.restart_count);  // the ranks' meeting may say otherwise
  absl::StatusOr<std::unique_ptr<Communicator>> world = CreateFromFlags(flags, plan->rank);
  if (!world.ok()) {
    out.status = world.status();
    return out;
  }
  out.status = rank_fn(**world, RankContext{plan->rank.local_rank, plan->rank.local_world_size,
                                            false});
  return out;
}

}  // namespace loom::comm::launch
