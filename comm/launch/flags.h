#ifndef LOOM_COMM_LAUNCH_FLAGS_H_
#define LOOM_COMM_LAUNCH_FLAGS_H_

// Command-line flags shared by every distributed binary. Flag names accept
// dashes or underscores (--nproc-per-node == --nproc_per_node):
//   --backend=local|mpi|ucx|nccl  --network=auto|ethernet|infiniband
//   --nproc-per-node=N            --rank --world-size --local-rank
//   --master-addr --master-port   --store=tcp|file:<dir>
//   --comm-timeout-s=300

#include <string>
#include <vector>

#include "comm/launch/discovery.h"

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
};

// Rewrites dashes in flag names to underscores in place (core/cli.h's
// NormalizeFlagNames), notes which flags were given, then
// absl::ParseCommandLine. Returns the positional arguments.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage);

CommFlags GetCommFlags();

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_FLAGS_H_
