#include "comm/launch/plan.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "comm/backend_registry.h"
#include "core/cli.h"

namespace loom::comm::launch {
namespace {

// `arg` as a shell word (single-quoted when it needs to be).
std::string ShellWord(const std::string& arg) {
  bool plain = !arg.empty();
  for (char ch : arg) {
    plain = plain && (absl::ascii_isalnum(static_cast<unsigned char>(ch)) ||
                      std::string("_-./=:,@%+").find(ch) != std::string::npos);
  }
  if (plain) return arg;
  return absl::StrCat("'", absl::StrReplaceAll(arg, {{"'", "'\\''"}}), "'");
}

std::string MpirunCommand(const LaunchRequest& r, int n) {
  std::vector<std::string> words = {"mpirun", "-np", absl::StrCat(n), ShellWord(r.program)};
  for (const std::string& a : WithoutNprocPerNode(r.args)) words.push_back(ShellWord(a));
  return absl::StrJoin(words, " ");
}

// The agent's flags the user gave, for messages.
std::string AgentFlags(const LaunchRequest& r) {
  return r.agent_flags.empty() ? std::string("--nnodes/--max-restarts/--heartbeat-timeout-s")
                               : absl::StrJoin(r.agent_flags, " ");
}

}  // namespace

std::vector<std::string> WithoutFlags(const std::vector<std::string>& args,
                                      const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {  // the rest is not ours
      out.insert(out.end(), args.begin() + i, args.end());
      break;
    }
    const std::string name = core::FlagName(args[i]);
    if (!name.empty() && std::find(names.begin(), names.end(), name) != names.end()) {
      if (args[i].find('=') == std::string::npos) ++i;  // "--flag V"
      continue;
    }
    out.push_back(args[i]);
  }
  return out;
}

std::vector<std::string> WithoutNprocPerNode(const std::vector<std::string>& args) {
  return WithoutFlags(args, {"nproc_per_node"});
}

absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchRequest& r, const EnvLookup& env) {
  LaunchPlan plan;
  const char* launched = env("LOOM_LAUNCHED");
  const bool our_child = launched != nullptr && std::string(launched) == "1";
  const std::vector<std::string> external = ExternalRankSettings(r.rank, env);
  const std::string backend = absl::StrCat(r.backend_flag, "=", r.backend);
  // Who starts this backend's ranks, from the registry (comm/<backend>/info.cc).
  absl::StatusOr<const BackendInfo*> info_or = LookupBackend(r.backend, r.backend_flag);
  if (!info_or.ok()) return info_or.status();
  const LaunchedBy by = (*info_or)->launched_by;
  const bool threads = by == LaunchedBy::kThreads, mpirun = by == LaunchedBy::kMpirun;

  const bool agent_flags = r.nnodes > 1 || r.supervised;
  if (our_child && threads) {
    // The agent's supervised process running the ranks as threads.
    int threads = 0;
    const char* v = env("LOOM_LOCAL_THREADS");
    if (v != nullptr && absl::SimpleAtoi(v, &threads) && threads >= 1) {
      plan.role = Role::kThreads;
      plan.nproc_per_node = threads;
      plan.world_size = threads;
      return plan;
    }
  }
  if (our_child || !external.empty()) {  // one rank of a world someone else started
    if (!our_child && agent_flags) {
      return absl::InvalidArgumentError(absl::StrCat(
          AgentFlags(r), " ", r.agent_flags.size() > 1 ? "are" : "is", " the agent's (this "
          "binary started without a launcher), but this process is one rank of a job started "
          "by someone else (", absl::StrJoin(external, ", "), "): restarting is that "
          "launcher's job (srun --requeue, torchrun --max-restarts). Drop ",
          r.agent_flags.size() > 1 ? "those flags" : "that flag",
          ", or start the job with this binary's own agent"));
    }
    if (!our_child && r.nproc_per_node.has_value() && *r.nproc_per_node > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nproc-per-node=", *r.nproc_per_node, " would start ", *r.nproc_per_node,
          " ranks here, but this process is already one rank of a job started by someone else (",
          absl::StrJoin(external, ", "), "): its launcher (torchrun, mpirun, srun) starts the "
          "ranks. Drop --nproc-per-node, or unset those variables and flags to let "
          "--nproc-per-node start the ranks"));
    }
    absl::StatusOr<RankInfo> info = DiscoverRank(r.rank, env);
    if (!info.ok()) return info.status();
    plan.rank = *info;
    plan.world_size = info->world_size;
    if (threads) {
      if (info->world_size > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            backend, " runs every rank as a thread of one process, but this process is rank ",
            info->rank, " of ", info->world_size, " started by ", info->source, ": use ",
            r.backend_flag, "=ucx (or mpi, nccl) to join that world"));
      }
      plan.role = Role::kThreads;
      plan.nproc_per_node = 1;
      return plan;
    }
    if (mpirun && info->world_size > 1 && info->from != RankSource::kOpenMpi &&
        info->from != RankSource::kSlurm) {
      return absl::InvalidArgumentError(absl::StrCat(
          backend, " takes its ranks from mpirun (or srun), but this process is rank ", info->rank,
          " of ", info->world_size, " started by ", info->source,
          ": MPI would make it a world of its own. Use ", r.backend_flag,
          "=ucx (or nccl) to join that world, or start the ranks with: ",
          MpirunCommand(r, info->world_size)));
    }
    if (!our_child && r.tcp_store && !r.has_secret && info->world_size > 1 &&
        (*info_or)->needs_store) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", info->rank, " of ", info->world_size, " started by ", info->source,
          " meets the others through rank 0's TCP store, which admits only connections that "
          "prove the job's secret: set the same LOOM_RENDEZVOUS_SECRET (or --rendezvous-secret) "
          "for every rank, e.g. export LOOM_RENDEZVOUS_SECRET=$(openssl rand -hex 32)"));
    }
    plan.role = Role::kRank;
    return plan;
  }

  // Nobody started this process: it is the whole job on this node.
  const int n = r.nproc_per_node.value_or(r.default_nproc_per_node);
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--nproc-per-node=", n, " must be >= 1"));
  }
  if (threads) {
    if (r.nnodes > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nnodes=", r.nnodes, " with ", backend, ": local runs every rank as a thread of one "
          "process; across nodes use ", r.backend_flag, "=ucx (or nccl)"));
    }
    plan.role = r.supervised ? Role::kLauncher : Role::kThreads;
    plan.ranks_as_threads = r.supervised;
    plan.nproc_per_node = n;
    plan.world_size = n;
    return plan;
  }
  if (mpirun && agent_flags) {
    return absl::InvalidArgumentError(absl::StrCat(
        AgentFlags(r), " start", r.agent_flags.size() > 1 ? "" : "s", " this binary's own "
        "agent, but ", backend, " takes its ranks from mpirun: use ", r.backend_flag,
        "=ucx (or nccl) for the agent, or mpirun's own fault handling"));
  }
  if (mpirun) {
    if (r.nproc_per_node.has_value() && n > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nproc-per-node=", n, " cannot start ", backend, " ranks: mpirun starts MPI's ranks "
          "and connects them (ranks started here would be ", n, " separate 1-rank worlds). Run:\n  ",
          MpirunCommand(r, n)));
    }
    if (n > 1) {
      plan.note = absl::StrCat(backend, " outside mpirun: a 1-rank MPI world. For ", n,
                               " ranks run: ", MpirunCommand(r, n));
    }
    plan.role = Role::kRank;  // MPI_Init makes it a singleton world
    plan.rank.source = "single process (MPI singleton: not started by mpirun)";
    return plan;
  }
  if (n == 1 && !agent_flags) {
    absl::StatusOr<RankInfo> info = DiscoverRank(r.rank, env);  // rank 0 of 1
    if (!info.ok()) return info.status();
    plan.role = Role::kRank;
    plan.rank = *info;
    return plan;
  }
  plan.role = Role::kLauncher;
  plan.nproc_per_node = n;
  plan.world_size = r.nnodes * n;
  return plan;
}

absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchRequest& request) {
  return PlanLaunch(request, RealEnv());
}

}  // namespace loom::comm::launch
