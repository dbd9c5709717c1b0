#include "comm/launch/flags.h"

#include <cstring>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"

ABSL_FLAG(std::string, backend, "local", "Collective backend: local, mpi or ucx.");
ABSL_FLAG(std::string, network, "auto", "auto, ethernet or infiniband (see comm/README.md).");
ABSL_FLAG(int, nproc_per_node, 1, "Ranks to start on this node (re-executes this binary).");
ABSL_FLAG(int, rank, -1, "This process's global rank (else from the environment).");
ABSL_FLAG(int, world_size, -1, "Number of ranks (else from the environment).");
ABSL_FLAG(int, local_rank, -1, "Rank on this node (else from the environment).");
ABSL_FLAG(std::string, master_addr, "", "Rendezvous host (rank 0); else MASTER_ADDR.");
ABSL_FLAG(int, master_port, -1, "Rendezvous TCP port; else MASTER_PORT.");
ABSL_FLAG(std::string, store, "tcp", "Rendezvous store: tcp or file:<shared directory>.");
ABSL_FLAG(double, comm_timeout_s, 300, "Per-operation timeout of collectives, seconds.");

namespace loom::comm::launch {

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage) {
  // Note: argv strings are rewritten in place (only the flag name part).
  for (int i = 1; i < argc; ++i) {
    char* a = argv[i];
    if (std::strcmp(a, "--") == 0) break;
    if (a[0] != '-' || a[1] != '-') continue;
    for (char* p = a + 2; *p && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

CommFlags GetCommFlags() {
  CommFlags f;
  f.backend = absl::GetFlag(FLAGS_backend);
  f.network = absl::GetFlag(FLAGS_network);
  f.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  f.rank.rank = absl::GetFlag(FLAGS_rank);
  f.rank.world_size = absl::GetFlag(FLAGS_world_size);
  f.rank.local_rank = absl::GetFlag(FLAGS_local_rank);
  f.rank.master_addr = absl::GetFlag(FLAGS_master_addr);
  f.rank.master_port = absl::GetFlag(FLAGS_master_port);
  f.store = absl::GetFlag(FLAGS_store);
  f.timeout_s = absl::GetFlag(FLAGS_comm_timeout_s);
  return f;
}

}  // namespace loom::comm::launch
