#ifndef LOOM_COMM_LAUNCH_FLAGS_H_
#define LOOM_COMM_LAUNCH_FLAGS_H_

// Command-line flags shared by every distributed binary. Flag names accept
// dashes or underscores (--nproc-per-node == --nproc_per_node):
//   --backend=local|mpi|ucx|nccl  --network=auto|ethernet|infiniband
//   --nproc-per-node=N            --rank --world-size --local-rank
//   --master-addr --master-port   --store=tcp|file:<dir>
//   --comm-timeout-s=300
// The agent (launcher.h; torchrun's names where torchrun has one):
//   --nnodes=N --node-rank=R      --max-restarts=M   --heartbeat-timeout-s=S
//   --rendezvous-secret (else LOOM_RENDEZVOUS_SECRET)
// The flight recorder (comm/flight): --flight-recorder-dir, --flight-recorder-entries

#include <string>
#include <vector>

#include "absl/status/status.h"

#include "comm/launch/discovery.h"
#include "comm/launch/launcher.h"
#include "comm/launch/plan.h"
#include "core/cli.h"

namespace loom::comm::launch {

struct CommFlags {
  std::string backend = "local";  // --backend
  bool backend_given = false;     // --backend was on the command line (ParseFlags saw it)
  std::string network = "auto";
  int nproc_per_node = 1;         // --nproc-per-node
  bool nproc_per_node_given = false;  // on the command line (a binary may default otherwise)
  ExplicitRank rank;
  std::string store = "tcp";
  double timeout_s = 300;
  // The agent: nodes in the job, this node's index, how often a failed job is
  // restarted, how long a rank may go without a heartbeat (0: unchecked).
  int nnodes = 1;
  bool nnodes_given = false;
  int node_rank = 0;
  int max_restarts = 0;
  double heartbeat_timeout_s = 0;
  // The per-job secret every store connection proves (--rendezvous-secret, else
  // LOOM_RENDEZVOUS_SECRET; "": the launcher makes one for its own node's ranks).
  std::string rendezvous_secret;
  // Where each rank writes its flight recorder on a timeout, an abort or
  // SIGUSR1 ("": not written), and how many operations each communicator keeps.
  std::string flight_recorder_dir;
  int flight_recorder_entries = 2048;
};

// Notes which flags were given, then core::ParseCommandLine: flag names
// rewritten to underscores in place, problems named with dashes (exit 2),
// `help` (if any) printed for --help. Returns the positional arguments.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage,
                              const core::HelpText& help = nullptr);

CommFlags GetCommFlags();

// Checks the agent's flags (--nnodes, --node-rank, --max-restarts,
// --heartbeat-timeout-s, --flight-recorder-entries) and, across nodes, the
// rendezvous address (discovery.h's ResolveMaster): errors name the flag.
absl::Status CheckAgentFlags(const CommFlags& flags, const EnvLookup& env);
absl::Status CheckAgentFlags(const CommFlags& flags);  // real environment

// The launch decision's inputs that come from these flags (a binary adds its
// program, arguments and default --nproc-per-node).
LaunchRequest LaunchRequestFor(const CommFlags& flags);
// What the node's agent is told, for a kLauncher plan (after CheckAgentFlags).
// Across nodes the agents meet at ResolveMaster's address; on one node only
// --master-addr/--master-port move rank 0's store (else a free port here).
LaunchOptions LaunchOptionsFor(const CommFlags& flags, const LaunchPlan& plan,
                               const EnvLookup& env);
LaunchOptions LaunchOptionsFor(const CommFlags& flags, const LaunchPlan& plan);  // real environment

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_FLAGS_H_
