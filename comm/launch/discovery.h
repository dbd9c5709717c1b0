#ifndef LOOM_COMM_LAUNCH_DISCOVERY_H_
#define LOOM_COMM_LAUNCH_DISCOVERY_H_

// Who am I? Rank discovery, in order:
//   1. explicit flags (--rank, --world-size, --local-rank),
//   2. torchrun-style environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//   3. OpenMPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//      OMPI_COMM_WORLD_LOCAL_SIZE,
//   4. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (ranks on this node from
//      SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE and SLURM_NODEID),
//   5. otherwise a single process (rank 0 of 1).
// The rendezvous address: --master-addr/--master-port, else MASTER_ADDR /
// MASTER_PORT, else 127.0.0.1:29500. Under torchrun, TORCHELASTIC_USE_AGENT_STORE,
// TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT say whose store is there.
// The start this is: LOOM_RESTART_COUNT (our agent), else torchrun's count.
// Flags and a launcher's variables that disagree (--world-size=4 with
// WORLD_SIZE=2) are an error naming both.
//
// This is the only code that reads launcher variables: binaries take what
// they need (local rank, ranks on this node) from RankInfo.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::comm::launch {

struct ExplicitRank {  // from flags; -1 / "" = not given
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  std::string master_addr;
  int master_port = -1;
};

// The rendezvous address when neither flags nor the environment give one.
inline constexpr char kDefaultMasterAddr[] = "127.0.0.1";
inline constexpr int kDefaultMasterPort = 29500;  // torchrun's

// Who started this process's world.
enum class RankSource { kSingleProcess, kFlags, kTorchrun, kOpenMpi, kSlurm };

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // ranks on this node (1 when the launcher does not say)
  std::string master_addr = kDefaultMasterAddr;
  int master_port = kDefaultMasterPort;
  RankSource from = RankSource::kSingleProcess;
  // torchrun's agent already serves a store at master_addr:master_port
  // (TORCHELASTIC_USE_AGENT_STORE=True, the address from MASTER_ADDR/
  // MASTER_PORT): rank 0 cannot listen there, every rank joins it as a
  // client instead (comm/launch/torchrun.h).
  bool torchrun_agent_store = false;
  std::string torchrun_run_id;    // TORCHELASTIC_RUN_ID ("" when not set)
  int torchrun_restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
  // How many times the job was restarted before this start: LOOM_RESTART_COUNT
  // (our agent; any source, e.g. a Slurm script that counts its attempts),
  // else torchrun_restart_count; 0 without either. What launch::RestartCount()
  // returns unless the ranks' meeting said otherwise (torchrun.h).
  int restart_count = 0;
  // For messages: "flags (--rank/--world-size)", "torchrun env (RANK/WORLD_SIZE)",
  // "OpenMPI env (...)", "Slurm env (...)", "single process (...)".
  std::string source = "single process (no flags or launcher environment)";
};

// `getenv` is injectable for tests. Errors name the variable or flag and
// the value that was wrong, or the one that is missing (RANK without
// WORLD_SIZE, LOCAL_RANK without RANK/WORLD_SIZE, ...).
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup RealEnv();
absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags, const EnvLookup& env);
absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags);  // real environment

// The rendezvous address alone (DiscoverRank's master_addr/master_port), for
// the agents of a multi-node job, which meet there before any rank exists.
struct Master {
  std::string addr = kDefaultMasterAddr;
  int port = kDefaultMasterPort;
  bool addr_given = false;  // by --master-addr or MASTER_ADDR, not the default
};
absl::StatusOr<Master> ResolveMaster(const ExplicitRank& flags, const EnvLookup& env);

// The rank flags and launcher variables that are set, as "NAME=value" /
// "--flag=value": any of them means this process is one rank of a world
// someone else started (our own launcher's children included). Empty: nobody did.
std::vector<std::string> ExternalRankSettings(const ExplicitRank& flags, const EnvLookup& env);

}  // namespace loom::comm::launch

#endif  // LOOM_COMM_LAUNCH_DISCOVERY_H_
