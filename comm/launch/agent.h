#ifndef LOOM_COMM_LAUNCH_AGENT_H_
#define LOOM_COMM_LAUNCH_AGENT_H_

// The agent: one per node, it starts that node's ranks and keeps the job
// alive (torchelastic's design, Loom's protocol). The agents of a job meet
// through a store (node 0's agent serves it over TCP; one node: in memory):
//
//   agent/a<n>/host<k>      node k's host name            (attempt n's rendezvous)
//   agent/a<n>/joined       agents that joined attempt n   (counter)
//   agent/a<n>/rank_port    the port rank 0 serves the ranks' own store on
//   agent/a<n>/failed       failures reported in attempt n (counter)
//   agent/a<n>/cause<i>     the i-th failure: "<severity> <unix ns> <text>"
//   agent/a<n>/final        set when attempt n must not be restarted (a signal)
//   agent/a<n>/succeeded    agents whose ranks all exited 0 (counter)
//   agent/a<n>/stopped      agents whose ranks are all down after a failure
//   agent/a<n>/exiting      agents leaving after success (node 0 serves until all left)
//
// An attempt: rendezvous (every agent joins; node 0 names the ranks' port),
// start the local ranks, watch them (exits, heartbeats, the store). Any
// failure anywhere -> every agent stops its ranks (SIGUSR1 for the flight
// recorder first, then SIGTERM, SIGKILL after a grace period) and reports
// them stopped; once all did, attempt n+1 starts the ranks again (they resume
// from the newest complete checkpoint in --save: train/), up to
// --max-restarts times. An agent that cannot reach the store, or a node that
// does not report its ranks stopped in time, ends the job on every node that
// can still tell: never a world that trains on with a node missing.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/store/store.h"

namespace loom::comm::launch {

struct AgentOptions {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  // --distributed-backend=local: one child process runs nproc_per_node ranks
  // as threads (LOOM_LOCAL_THREADS); the agent supervises that process.
  bool ranks_as_threads = false;
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the ranks' store
  int rank_port = 0;                      // one node: the ranks' port (0: pick)
  std::string secret;                     // handed to the ranks (LOOM_RENDEZVOUS_SECRET)
  int max_restarts = 0;
  absl::Duration heartbeat_timeout = absl::ZeroDuration();  // zero: unchecked
  // After a failure: how long ranks get between SIGTERM and SIGKILL.
  absl::Duration kill_grace = absl::Seconds(5);
  // After a forwarded SIGINT/SIGTERM (a user, a scheduler's preemption): how
  // long ranks get to finish (--exit-signal-handler saves first).
  absl::Duration signal_grace = absl::Seconds(5);
  // The agents' rendezvous, store replies and the stop barrier.
  absl::Duration timeout = absl::Minutes(5);
  // SIGUSR1 to the ranks before stopping them (they write flight recorder dumps).
  bool dump_flight_recorder = false;
  std::function<void(const std::string&)> log;  // default: stderr
};

// Runs the agent until the job ends: OK iff every rank of the last attempt
// exited 0 on every node (or all stopped cleanly after a forwarded signal).
// `argv`: the command every local rank runs (this binary). `store`: shared by
// the job's agents (see above); `store_host` names its server in messages.
absl::Status RunAgent(const AgentOptions& options, Store& store, const std::string& store_host,
                      const std::vector<std::string>& argv);

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_AGENT_H_
