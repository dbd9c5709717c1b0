#include "comm/launch/discovery.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::comm::launch {
namespace {

// Reads an integer variable; absent -> *present = false.
absl::Status ReadInt(const EnvLookup& env, const char* name, int* out, bool* present) {
  const char* v = env(name);
  *present = v != nullptr && *v != '\0';
  if (!*present) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", v, "' is not an integer"));
  }
  return absl::OkStatus();
}

struct Source {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
};

}  // namespace

absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags, const EnvLookup& env) {
  RankInfo info;
  bool found = false;
  if (flags.rank >= 0 || flags.world_size >= 0) {
    if (flags.rank < 0 || flags.world_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rank=", flags.rank, " and --world-size=", flags.world_size,
          " must be given together (rank >= 0, world size >= 1)"));
    }
    info.rank = flags.rank;
    info.world_size = flags.world_size;
    info.local_rank = flags.local_rank >= 0 ? flags.local_rank : flags.rank;
    info.source = "flags (--rank/--world-size)";
    found = true;
  }
  const Source sources[] = {
      {"torchrun env (RANK/WORLD_SIZE)", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"OpenMPI env (OMPI_COMM_WORLD_RANK/SIZE)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"Slurm env (SLURM_PROCID/SLURM_NTASKS)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };
  for (const Source& src : sources) {
    if (found) break;
    int rank = 0, size = 0, local = 0;
    bool has_rank, has_size, has_local;
    absl::Status s = ReadInt(env, src.rank, &rank, &has_rank);
    if (s.ok()) s = ReadInt(env, src.size, &size, &has_size);
    if (s.ok()) s = ReadInt(env, src.local_rank, &local, &has_local);
    if (!s.ok()) return s;
    if (!has_rank && !has_size) continue;
    if (has_rank != has_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "only one of ", src.rank, " and ", src.size, " is set; set both (", src.name, ")"));
    }
    info.rank = rank;
    info.world_size = size;
    info.local_rank = has_local ? local : rank;
    info.source = src.name;
    found = true;
  }
  if (!found) info.source = "single process (no flags or launcher environment)";
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", info.rank, " is out of range for world size ",
                                                   info.world_size, " (from ", info.source, ")"));
  }
  if (!flags.master_addr.empty()) {
    info.master_addr = flags.master_addr;
  } else if (const char* a = env("MASTER_ADDR"); a && *a) {
    info.master_addr = a;
  }
  if (flags.master_port >= 0) {
    info.master_port = flags.master_port;
  } else {
    bool has = false;
    int port = 0;
    absl::Status s = ReadInt(env, "MASTER_PORT", &port, &has);
    if (!s.ok()) return s;
    if (has) info.master_port = port;
  }
  if (info.master_port < 1 || info.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("master port ", info.master_port,
                                                   " is out of range [1, 65535] (--master-port "
                                                   "or MASTER_PORT)"));
  }
  return info;
}

absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags) {
  return DiscoverRank(flags, [](const char* n) -> const char* { return std::getenv(n); });
}

}  // namespace loom::comm::launch
