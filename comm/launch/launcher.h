#ifndef LOOM_COMM_LAUNCH_LAUNCHER_H_
#define LOOM_COMM_LAUNCH_LAUNCHER_H_

// The launcher: `--nproc-per-node=K` (and, across nodes, `--nnodes=N
// --node-rank=R --master-addr=H --master-port=P`, torchrun's flags) makes this
// binary the node's agent (agent.h): it re-executes itself once per local rank
// with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT, LOOM_RENDEZVOUS_SECRET, LOOM_RESTART_COUNT and
// LOOM_HEARTBEAT_FD set, forwards SIGINT/SIGTERM to the ranks, and if a
// rank fails, stops the others, restarts them all (--max-restarts) or
// reports that rank and its exit status. Children die with the agent
// (PR_SET_PDEATHSIG): no orphans.
//
// Binaries do not call LaunchAndWait themselves: run_ranks.h's RunRanks plans
// (plan.h), validates against the plan, and runs the agent for a kLauncher plan.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::comm::launch {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  // One node: where rank 0 serves the ranks' store (port 0: pick a free one).
  // Several: where node 0's agent serves the agents' store (the ranks' own
  // store gets a free port on the same host, chosen by node 0's agent).
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // The job's secret (--rendezvous-secret / LOOM_RENDEZVOUS_SECRET): required
  // across nodes; with one node "" makes a fresh one.
  std::string secret;
  int max_restarts = 0;
  absl::Duration heartbeat_timeout = absl::ZeroDuration();  // zero: unchecked
  // After a failure: how long the other ranks get to exit after SIGTERM
  // before SIGKILL.
  absl::Duration kill_grace = absl::Seconds(5);
  // After a forwarded SIGINT/SIGTERM: how long ranks get before SIGKILL
  // (--exit-signal-handler: time to finish the step and save).
  absl::Duration signal_grace = absl::Seconds(5);
  // The agents' rendezvous and store calls, and how long a node may take to
  // report its ranks stopped after a failure.
  absl::Duration timeout = absl::Minutes(5);
  // --distributed-backend=local: one process runs the ranks as threads.
  bool ranks_as_threads = false;
  // --flight-recorder-dir is set: ranks get SIGUSR1 before they are stopped.
  bool dump_flight_recorder = false;
};

// True in a process started by LaunchAndWait (LOOM_LAUNCHED=1).
bool IsLaunchedChild();

// In a rank started by the agent: how many times the job was restarted before
// this start (discovery.h's RankInfo::restart_count: LOOM_RESTART_COUNT,
// torchelastic's TORCHELASTIC_RESTART_COUNT); 0 on the first start and in a
// process no agent started. RunRanks sets it from the plan's RankInfo.
int RestartCount();
// Under torchrun the world's start count comes from the ranks' meeting
// (comm/launch/torchrun.h), not from TORCHELASTIC_RESTART_COUNT, which each
// node's agent counts on its own: RestartCount() returns `n` from then on.
void SetRestartCount(int n);

// Runs argv[0..argc) (this very binary, /proc/self/exe) once per rank and
// waits for all. Refuses (FailedPrecondition, before starting anything) in a
// process that is already a rank: one it started, or one whose environment
// says a launcher started it (RANK/WORLD_SIZE, OpenMPI's or Slurm's variables). OK iff every rank exited 0; otherwise an error naming the
// first rank that failed and how ("rank 1 (pid 123) was killed by signal 9").
absl::Status LaunchAndWait(const LaunchOptions& options, int argc, char** argv);

// A TCP port that was free a moment ago on 127.0.0.1.
absl::StatusOr<int> PickFreePort();

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_LAUNCHER_H_
