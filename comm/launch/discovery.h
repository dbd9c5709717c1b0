#ifndef LOOM_COMM_LAUNCH_DISCOVERY_H_
#define LOOM_COMM_LAUNCH_DISCOVERY_H_

// Who am I? Rank discovery, in order:
//   1. explicit flags (--rank, --world-size, --local-rank),
//   2. torchrun-style environment: RANK, WORLD_SIZE, LOCAL_RANK,
//   3. OpenMPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//   4. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//   5. otherwise a single process (rank 0 of 1).
// The rendezvous address: --master-addr/--master-port, else MASTER_ADDR /
// MASTER_PORT, else 127.0.0.1:29500.

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace loom::comm::launch {

struct ExplicitRank {  // from flags; -1 / "" = not given
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  std::string master_addr;
  int master_port = -1;
};

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source;  // "flags", "torchrun env", "OpenMPI env", "Slurm env", "single process"
};

// `getenv` is injectable for tests. Errors name the variable or flag and
// the value that was wrong.
using EnvLookup = std::function<const char*(const char*)>;
absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags, const EnvLookup& env);
absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags);  // real environment

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_DISCOVERY_H_
