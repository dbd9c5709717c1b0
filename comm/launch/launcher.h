#ifndef LOOM_COMM_LAUNCH_LAUNCHER_H_
#define LOOM_COMM_LAUNCH_LAUNCHER_H_

// `--nproc-per-node=N`: the binary re-executes itself N times with RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set
// (a free port is picked), forwards SIGINT/SIGTERM to the ranks, and if a rank
// fails, stops the others and reports that rank and its exit status.
// Children die with the launcher (PR_SET_PDEATHSIG): no orphans.
//
//   int main(int argc, char** argv) {
//     ... parse flags ...
//     auto plan = launch::PlanLaunch(request);        // see plan.h
//     ... validate everything against plan->world_size ...
//     if (plan->role == launch::Role::kLauncher) {
//       absl::Status s = launch::LaunchAndWait({.nproc_per_node = plan->nproc_per_node}, argc, argv);
//       if (!s.ok()) std::cerr << s << "\n";
//       return s.ok() ? 0 : 1;
//     }
//     ... this process is one rank (plan->rank) ...

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::comm::launch {

struct LaunchOptions {
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port
  // After a failure (or a forwarded signal): how long the other ranks get to
  // exit after SIGTERM before SIGKILL.
  absl::Duration kill_grace = absl::Seconds(5);
};

// True in a process started by LaunchAndWait (LOOM_LAUNCHED=1).
bool IsLaunchedChild();

// In a rank started by the agent: how many times the job was restarted before
// this start (LOOM_RESTART_COUNT, torchelastic's TORCHELASTIC_RESTART_COUNT);
// 0 on the first start and in a process no agent started.
int RestartCount();

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
