#ifndef LOOM_COMM_LAUNCH_PLAN_H_
#define LOOM_COMM_LAUNCH_PLAN_H_

// What this process is in the job, decided once, before any rank starts
// (so a binary can validate its whole configuration against the world it is
// about to start or join first):
//
//   Someone else started this process -- any of --rank/--world-size/--local-rank,
//   RANK/WORLD_SIZE/LOCAL_RANK (torchrun, or our own launcher), OpenMPI's or
//   Slurm's variables: it is one rank of that world (kRank) and never starts
//   ranks of its own. An explicit --nproc-per-node > 1 is then an error naming
//   both; a partial set (RANK without WORLD_SIZE) is an error naming what is
//   missing.
//   Nobody did, N = --nproc-per-node (or the binary's default):
//     local: N ranks as threads of this process (kThreads);
//     mpi:   mpirun starts MPI's ranks: an explicit N > 1 is an error giving the
//            mpirun command; otherwise a 1-rank MPI world (kRank, with a note
//            when the binary's default asked for more);
//     ucx, nccl: N > 1 starts N local ranks (kLauncher, see launcher.h);
//            N = 1 is a single rank (kRank).
//   The agent's flags (--nnodes > 1, --max-restarts, --heartbeat-timeout-s)
//   make this process the node's agent (kLauncher) for ucx and nccl, and for
//   local (one supervised process running the ranks as threads); mpirun's
//   ranks and ranks someone else started are not ours to restart: an error.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/launch/discovery.h"

namespace loom::comm::launch {

struct LaunchRequest {
  std::string backend;                     // a registered backend (backend_registry.h)
  std::string backend_flag = "--backend";  // the flag that chose it, for messages
  ExplicitRank rank;                       // --rank, --world-size, --local-rank, --master-*
  std::optional<int> nproc_per_node;       // --nproc-per-node when given
  int default_nproc_per_node = 1;          // this binary's default
  // The agent's flags: --nnodes (> 1: one agent per node), and whether the
  // ranks are supervised (--max-restarts > 0 or --heartbeat-timeout-s > 0),
  // which needs an agent even for one rank.
  int nnodes = 1;
  bool supervised = false;
  // Those flags as given ("--max-restarts=2"), for messages.
  std::vector<std::string> agent_flags;
  // Ranks that meet through a TCP store (--store=tcp, ucx or nccl) need the
  // job's secret when someone else started them (--rendezvous-secret or
  // LOOM_RENDEZVOUS_SECRET); our own agent hands its ranks one.
  bool tcp_store = true;
  bool has_secret = false;
  // For the mpirun command suggested with mpi: how to run this binary, and the
  // arguments the user gave (--nproc-per-node is left out of the suggestion).
  std::string program = "<binary>";
  std::vector<std::string> args;
};

enum class Role {
  kRank,      // this process is one rank (of a world someone else started, or of 1)
  kThreads,   // this process runs nproc_per_node ranks as threads (local backend)
  kLauncher,  // this process is the node's agent: starts its ranks (LaunchAndWait), waits
};

struct LaunchPlan {
  Role role = Role::kRank;
  int world_size = 1;      // ranks in the world this process starts or joins
  int nproc_per_node = 1;  // kThreads / kLauncher: ranks started on this node
  bool ranks_as_threads = false;  // kLauncher: the agent's one process runs them as threads
  RankInfo rank;           // kRank: who this process is
  std::string note;        // something the user should know ("": nothing)
};

absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchRequest& request, const EnvLookup& env);
absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchRequest& request);  // real environment

// `args` without the flags named (underscore spelling, e.g. "nproc_per_node"),
// in either spelling, "=V" or a separate value; everything after "--" is kept.
std::vector<std::string> WithoutFlags(const std::vector<std::string>& args,
                                      const std::vector<std::string>& names);
// `args` without --nproc-per-node.
std::vector<std::string> WithoutNprocPerNode(const std::vector<std::string>& args);

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_PLAN_H_
