#ifndef LOOM_COMM_LAUNCH_RUN_RANKS_H_
#define LOOM_COMM_LAUNCH_RUN_RANKS_H_

// "Run these ranks": the one entry every binary that starts ranks calls,
// instead of each hand-rolling PlanLaunch + LaunchAndWait + a thread loop +
// CreateFromFlags. In order:
//   1. checks the comm flags (CheckCommFlags, CheckAgentFlags) and plans the
//      launch (PlanLaunch; who starts the backend's ranks is the registry's
//      BackendInfo::launched_by);
//   2. `route_signals` (optional, not in the agent): SIGTERM and SIGUSR1 go
//      to an idle thread of their own from now on;
//   3. `validate(plan)` (optional): the binary's own checks against the world
//      it is about to start or join;
//   4. kLauncher: this process is the node's agent: LaunchAndWait(argv, or
//      what `adjust_child_argv` makes of it);
//      kThreads: plan.nproc_per_node ranks as threads of this process, each
//      created by the backend's factory over one MemoryStore;
//      kRank: RestartCount() is plan.rank's, then CreateFromFlags(flags, plan.rank);
//      and calls `rank_fn` once per rank with its world communicator.
//
//   RanksOutcome out = launch::RunRanks(flags, options, argc, argv, RunRank);
//   if (!out.status.ok()) std::cerr << out.status << "\n";
//   return out.ExitCode();

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/comm.h"
#include "comm/launch/flags.h"
#include "comm/launch/plan.h"

namespace loom::comm::launch {

struct RunRanksOptions {
  int default_nproc_per_node = 1;          // without --nproc-per-node
  std::string backend_flag = "--backend";  // for messages
  // For PlanLaunch's messages (the mpirun command it suggests): how to run
  // this binary and the arguments given. Default: argv.
  std::string program;
  std::vector<std::string> args;
  // A rank takes SIGTERM (a preemption, the agent's forward) and SIGUSR1 (a
  // flight-recorder dump) on an idle thread, never mid-computation
  // (core/signal_thread.h): routed before `validate` and before any thread
  // starts. Not in the agent, which forwards SIGINT/SIGTERM to its ranks.
  bool route_signals = false;
  // Checks against the plan before any rank starts (errors: exit 2).
  std::function<absl::Status(const LaunchPlan&)> validate;
  // kLauncher only: how the agent is run (default LaunchOptionsFor), and the
  // command line it starts each rank with (default argv, argv[0] first), e.g.
  // with flags added before a "--" (the last of a flag wins). Both are called
  // after `validate`.
  std::function<void(LaunchOptions*)> adjust_launch;
  std::function<void(std::vector<std::string>* argv)> adjust_child_argv;
};

// What a rank is told besides its communicator.
struct RankContext {
  int local_rank = 0;
  int local_world_size = 1;
  bool thread = false;  // one of several ranks in this process (kThreads)
};

using RankFn = std::function<absl::Status(Communicator& world, const RankContext& context)>;

struct RanksOutcome {
  absl::Status status;
  bool started = false;  // a rank or the agent ran (false: refused before)
  Role role = Role::kRank;  // what this process was
  // 0 OK; 2 refused before anything started (a flag, the plan); 1 a failure.
  int ExitCode() const { return status.ok() ? 0 : (started ? 1 : 2); }
};

RanksOutcome RunRanks(const CommFlags& flags, const RunRanksOptions& options, int argc,
                      char** argv, const RankFn& rank_fn);

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_RUN_RANKS_H_
