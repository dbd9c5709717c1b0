#include "comm/launch/discovery.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace loom::comm::launch {
namespace {

bool IsSet(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr && *v != '\0';
}

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
  RankSource from;
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: computed (Slurm)
};

constexpr Source kSources[] = {
    {RankSource::kTorchrun, "torchrun env (RANK/WORLD_SIZE)", "RANK", "WORLD_SIZE", "LOCAL_RANK",
     "LOCAL_WORLD_SIZE"},
    {RankSource::kOpenMpi, "OpenMPI env (OMPI_COMM_WORLD_RANK/SIZE)", "OMPI_COMM_WORLD_RANK",
     "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {RankSource::kSlurm, "Slurm env (SLURM_PROCID/SLURM_NTASKS)", "SLURM_PROCID", "SLURM_NTASKS",
     "SLURM_LOCALID", nullptr},
};

// Slurm's tasks on this node: SLURM_STEP_TASKS_PER_NODE (else
// SLURM_TASKS_PER_NODE) is "2(x3),1" (2 on each of nodes 0-2, 1 on node 3);
// SLURM_NODEID picks the entry. 1 when absent or unreadable.
int SlurmTasksOnThisNode(const EnvLookup& env) {
  const char* list = env("SLURM_STEP_TASKS_PER_NODE");
  if (list == nullptr || *list == '\0') list = env("SLURM_TASKS_PER_NODE");
  if (list == nullptr || *list == '\0') return 1;
  int node = 0;
  bool has_node = false;
  if (!ReadInt(env, "SLURM_NODEID", &node, &has_node).ok() || node < 0) return 1;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    int tasks = 0, repeat = 1;
    const size_t paren = entry.find("(x");
    if (paren != absl::string_view::npos) {
      if (!absl::EndsWith(entry, ")") ||
          !absl::SimpleAtoi(entry.substr(paren + 2, entry.size() - paren - 3), &repeat)) {
        return 1;
      }
      entry = entry.substr(0, paren);
    }
    if (!absl::SimpleAtoi(entry, &tasks) || tasks < 1 || repeat < 1) return 1;
    if (node < repeat) return tasks;
    node -= repeat;
  }
  return 1;
}

// A launcher's variables next to --rank/--world-size/--local-rank must say
// the same: two different worlds in one process is a typo, not a choice.
absl::Status CheckFlagsAgreeWithLauncher(const ExplicitRank& flags, const EnvLookup& env) {
  for (const Source& src : kSources) {
    const struct {
      const char* flag;
      int value;
      const char* var;
    } pairs[] = {{"--rank", flags.rank, src.rank},
                 {"--world-size", flags.world_size, src.size},
                 {"--local-rank", flags.local_rank, src.local_rank}};
    for (const auto& p : pairs) {
      int from_env = 0;
      bool has = false;
      if (p.value < 0 || !ReadInt(env, p.var, &from_env, &has).ok() || !has) continue;
      if (from_env != p.value) {
        return absl::InvalidArgumentError(absl::StrCat(
            p.flag, "=", p.value, " disagrees with ", p.var, "=", env(p.var), " from ", src.name,
            ": the launcher already chose this process's place; drop ", p.flag,
            " or make it match"));
      }
    }
  }
  return absl::OkStatus();
}

// torchrun's variables about its own store (torch/distributed/rendezvous.py's
// _agent_store_serves: the agent serves only its own MASTER_ADDR:MASTER_PORT).
absl::Status ReadTorchrunStore(const ExplicitRank& flags, const EnvLookup& env, RankInfo* info) {
  const char* use = env("TORCHELASTIC_USE_AGENT_STORE");
  bool has_restart = false;
  absl::Status s = ReadInt(env, "TORCHELASTIC_RESTART_COUNT", &info->torchrun_restart_count,
                           &has_restart);
  if (!s.ok()) return s;
  if (info->torchrun_restart_count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable TORCHELASTIC_RESTART_COUNT='",
                                                   env("TORCHELASTIC_RESTART_COUNT"),
                                                   "' must be >= 0"));
  }
  if (IsSet(env, "TORCHELASTIC_RUN_ID")) info->torchrun_run_id = env("TORCHELASTIC_RUN_ID");
  if (use == nullptr || std::string(use) != "True") return absl::OkStatus();
  if (!flags.master_addr.empty() || flags.master_port >= 0) return absl::OkStatus();
  for (const char* var : {"MASTER_ADDR", "MASTER_PORT"}) {
    if (!IsSet(env, var)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TORCHELASTIC_USE_AGENT_STORE=True says torchrun's agent serves a store at "
          "MASTER_ADDR:MASTER_PORT, but ", var, " is not set: start the job with torchrun, "
          "or unset TORCHELASTIC_USE_AGENT_STORE"));
    }
  }
  info->torchrun_agent_store = true;
  return absl::OkStatus();
}

// LOOM_RESTART_COUNT when set: a value that is not a count >= 1 reads as 0.
std::optional<int> LoomRestartCount(const EnvLookup& env) {
  const char* v = env("LOOM_RESTART_COUNT");
  if (v == nullptr || *v == '\0') return std::nullopt;
  int n = 0;
  return absl::SimpleAtoi(v, &n) && n > 0 ? n : 0;
}

}  // namespace

EnvLookup RealEnv() {
  return [](const char* n) -> const char* { return std::getenv(n); };
}

std::vector<std::string> ExternalRankSettings(const ExplicitRank& flags, const EnvLookup& env) {
  std::vector<std::string> out;
  if (flags.rank >= 0) out.push_back(absl::StrCat("--rank=", flags.rank));
  if (flags.world_size >= 0) out.push_back(absl::StrCat("--world-size=", flags.world_size));
  if (flags.local_rank >= 0) out.push_back(absl::StrCat("--local-rank=", flags.local_rank));
  for (const Source& src : kSources) {
    for (const char* var : {src.rank, src.size, src.local_rank}) {
      if (IsSet(env, var)) out.push_back(absl::StrCat(var, "=", env(var)));
    }
  }
  return out;
}

absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags, const EnvLookup& env) {
  RankInfo info;
  bool found = false;
  if (flags.rank >= 0 || flags.world_size >= 0 || flags.local_rank >= 0) {
    absl::Status agree = CheckFlagsAgreeWithLauncher(flags, env);
    if (!agree.ok()) return agree;
  }
  // Half of --rank/--world-size next to a launcher's variables that agree
  // with it: the launcher's world, below.
  const bool launcher_says = !ExternalRankSettings({}, env).empty();
  if ((flags.rank >= 0 && flags.world_size >= 1) ||
      (!launcher_says && (flags.rank >= 0 || flags.world_size >= 0))) {
    if (flags.rank < 0 || flags.world_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rank=", flags.rank, " and --world-size=", flags.world_size,
          " must be given together (rank >= 0, world size >= 1)"));
    }
    info.rank = flags.rank;
    info.world_size = flags.world_size;
    info.local_rank = flags.local_rank >= 0 ? flags.local_rank : flags.rank;
    bool has_local_size = false;
    absl::Status s = ReadInt(env, "LOCAL_WORLD_SIZE", &info.local_world_size, &has_local_size);
    if (!s.ok()) return s;
    if (!has_local_size) info.local_world_size = 1;
    info.from = RankSource::kFlags;
    info.source = "flags (--rank/--world-size)";
    found = true;
  }
  for (const Source& src : kSources) {
    if (found) break;
    int rank = 0, size = 0, local = 0, local_size = 1;
    bool has_rank, has_size, has_local, has_local_size = false;
    absl::Status s = ReadInt(env, src.rank, &rank, &has_rank);
    if (s.ok()) s = ReadInt(env, src.size, &size, &has_size);
    if (s.ok()) s = ReadInt(env, src.local_rank, &local, &has_local);
    if (s.ok() && src.local_size != nullptr) {
      s = ReadInt(env, src.local_size, &local_size, &has_local_size);
    }
    if (!s.ok()) return s;
    if (!has_rank && !has_size) continue;
    if (has_rank != has_size) {
      const char* set = has_rank ? src.rank : src.size;
      const char* missing = has_rank ? src.size : src.rank;
      return absl::InvalidArgumentError(absl::StrCat(
          set, "=", env(set), " is set but ", missing, " is not: this process looks like one rank "
          "of a job started by a launcher (", src.name, "), which sets both; set ", missing,
          " too, or unset ", set, " to run on your own"));
    }
    info.rank = rank;
    info.world_size = size;
    info.local_rank = has_local ? local : rank;
    info.local_world_size = src.local_size != nullptr
                                ? (has_local_size ? local_size : 1)
                                : SlurmTasksOnThisNode(env);
    info.from = src.from;
    info.source = src.name;
    found = true;
  }
  if (!found) {
    // A local rank alone says a launcher started this process, but not which world it is in.
    if (flags.local_rank >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--local-rank=", flags.local_rank, " is set but neither --rank/--world-size nor "
          "RANK/WORLD_SIZE are: set them too, or drop --local-rank to run on your own"));
    }
    if (IsSet(env, "LOCAL_RANK")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LOCAL_RANK=", env("LOCAL_RANK"), " is set but RANK and WORLD_SIZE are not: this "
          "process looks like one rank of a job started by a launcher (torchrun sets all three); "
          "set RANK and WORLD_SIZE too, or unset LOCAL_RANK to run on your own"));
    }
  }
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", info.rank, " is out of range for world size ",
                                                   info.world_size, " (from ", info.source, ")"));
  }
  if (info.local_world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ranks on this node (", info.local_world_size,
                                                   ", from ", info.source, ") must be >= 1"));
  }
  absl::StatusOr<Master> master = ResolveMaster(flags, env);
  if (!master.ok()) return master.status();
  info.master_addr = master->addr;
  info.master_port = master->port;
  if (info.from == RankSource::kTorchrun) {
    absl::Status s = ReadTorchrunStore(flags, env, &info);
    if (!s.ok()) return s;
  }
  info.restart_count = LoomRestartCount(env).value_or(info.torchrun_restart_count);
  return info;
}

absl::StatusOr<Master> ResolveMaster(const ExplicitRank& flags, const EnvLookup& env) {
  Master m;
  if (!flags.master_addr.empty()) {
    m.addr = flags.master_addr;
    m.addr_given = true;
  } else if (IsSet(env, "MASTER_ADDR")) {
    m.addr = env("MASTER_ADDR");
    m.addr_given = true;
  }
  if (flags.master_port >= 0) {
    m.port = flags.master_port;
  } else {
    bool has = false;
    int port = 0;
    absl::Status s = ReadInt(env, "MASTER_PORT", &port, &has);
    if (!s.ok()) return s;
    if (has) m.port = port;
  }
  if (m.port < 1 || m.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("master port ", m.port,
                                                   " is out of range [1, 65535] (--master-port "
                                                   "or MASTER_PORT)"));
  }
  return m;
}

absl::StatusOr<RankInfo> DiscoverRank(const ExplicitRank& flags) {
  return DiscoverRank(flags, RealEnv());
}

}  // namespace loom::comm::launch
