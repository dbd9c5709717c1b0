#include "comm/launch/flags.h"

#include <cstdlib>
#include <mutex>
#include <set>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/cli.h"

ABSL_FLAG(std::string, backend, loom::comm::launch::CommFlags{}.backend,
          "Collective backend: local, mpi, ucx or nccl. //train:gpt: Loom's name for Megatron's "
          "--distributed-backend, which wins when both are given.");
ABSL_FLAG(std::string, network, loom::comm::launch::CommFlags{}.network,
          "auto, ethernet or infiniband (see comm/README.md).");
ABSL_FLAG(int, nproc_per_node, loom::comm::launch::CommFlags{}.nproc_per_node,
          "Ranks to start on this node, each re-executing this binary (not given: the binary's "
          "default, which //train:gpt --help shows). Not with a launcher's RANK/WORLD_SIZE, "
          "OpenMPI or Slurm variables: then this process is one rank.");
ABSL_FLAG(int, rank, -1, "This process's global rank (else from the environment).");
ABSL_FLAG(int, world_size, -1, "Number of ranks (else from the environment).");
ABSL_FLAG(int, local_rank, -1, "Rank on this node (else from the environment).");
ABSL_FLAG(std::string, master_addr, "", "Rendezvous host (rank 0); else MASTER_ADDR.");
ABSL_FLAG(int, master_port, -1, "Rendezvous TCP port; else MASTER_PORT.");
ABSL_FLAG(std::string, store, loom::comm::launch::CommFlags{}.store,
          "Rendezvous store: tcp or file:<shared directory>.");
ABSL_FLAG(double, comm_timeout_s, loom::comm::launch::CommFlags{}.timeout_s,
          "Per-operation timeout of collectives, seconds.");
ABSL_FLAG(int, nnodes, 1,
          "Nodes in the job: one agent per node (this binary with --nproc-per-node) starts that "
          "node's ranks; the agents meet at --master-addr:--master-port (torchrun's flag).");
ABSL_FLAG(int, node_rank, 0, "This node's index in [0, --nnodes) (torchrun's flag).");
ABSL_FLAG(int, max_restarts, 0,
          "Restarts of the whole job after a rank fails (exit, signal, hang, collective "
          "timeout): every node's ranks are stopped and started again from the newest complete "
          "checkpoint in --save.");
ABSL_FLAG(double, heartbeat_timeout_s, 0,
          "A rank that reports no progress for this long is declared hung and handled like a "
          "failure (0: not checked).");
ABSL_FLAG(std::string, rendezvous_secret, "",
          "The job's secret, proven by every connection to the rendezvous store (else "
          "LOOM_RENDEZVOUS_SECRET; one node: made by the launcher). Same on every node.");
ABSL_FLAG(std::string, flight_recorder_dir, "",
          "Folder where every rank writes its last collective operations on a timeout, an "
          "abort or SIGUSR1; read them with `bazel run //comm:flight -- DIR`.");
ABSL_FLAG(int, flight_recorder_entries, loom::comm::launch::CommFlags{}.flight_recorder_entries,
          "Operations each communicator's flight recorder keeps.");

namespace loom::comm::launch {
namespace {

absl::Mutex given_mu;
std::set<std::string>* given ABSL_GUARDED_BY(given_mu) = nullptr;  // flag names on the command line

bool Given(const std::string& name) {
  absl::MutexLock l(&given_mu);
  return given != nullptr && given->count(name) > 0;
}

}  // namespace

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage,
                              const core::HelpText& help) {
  {
    absl::MutexLock l(&given_mu);
    if (given == nullptr) given = new std::set<std::string>;
    given->clear();
    for (const std::string& name : core::FlagNamesIn(std::vector<std::string>(argv, argv + argc))) {
      given->insert(name);
    }
  }
  static std::once_flag usage_once;  // Abseil allows one usage message per process
  std::call_once(usage_once, [usage] { absl::SetProgramUsageMessage(usage); });
  return core::ParseCommandLine(argc, argv, help);
}

CommFlags GetCommFlags() {
  CommFlags f;
  f.backend = absl::GetFlag(FLAGS_backend);
  f.backend_given = Given("backend");
  f.network = absl::GetFlag(FLAGS_network);
  f.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  f.nproc_per_node_given = Given("nproc_per_node");
  f.rank.rank = absl::GetFlag(FLAGS_rank);
  f.rank.world_size = absl::GetFlag(FLAGS_world_size);
  f.rank.local_rank = absl::GetFlag(FLAGS_local_rank);
  f.rank.master_addr = absl::GetFlag(FLAGS_master_addr);
  f.rank.master_port = absl::GetFlag(FLAGS_master_port);
  f.store = absl::GetFlag(FLAGS_store);
  f.timeout_s = absl::GetFlag(FLAGS_comm_timeout_s);
  f.nnodes = absl::GetFlag(FLAGS_nnodes);
  f.nnodes_given = Given("nnodes");
  f.node_rank = absl::GetFlag(FLAGS_node_rank);
  f.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  f.heartbeat_timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout_s);
  f.rendezvous_secret = absl::GetFlag(FLAGS_rendezvous_secret);
  if (f.rendezvous_secret.empty()) {
    const char* env = std::getenv("LOOM_RENDEZVOUS_SECRET");
    if (env != nullptr) f.rendezvous_secret = env;
  }
  f.flight_recorder_dir = absl::GetFlag(FLAGS_flight_recorder_dir);
  f.flight_recorder_entries = absl::GetFlag(FLAGS_flight_recorder_entries);
  return f;
}

absl::Status CheckAgentFlags(const CommFlags& f, const EnvLookup& env) {
  if (f.nnodes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--nnodes=", f.nnodes, " must be >= 1"));
  }
  if (f.node_rank < 0 || f.node_rank >= f.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat("--node-rank=", f.node_rank,
                                                   " must be in [0, --nnodes=", f.nnodes, ")"));
  }
  if (f.max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-restarts=", f.max_restarts, " must be >= 0"));
  }
  if (!(f.heartbeat_timeout_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heartbeat-timeout-s=", f.heartbeat_timeout_s, " must be >= 0 (0: not checked)"));
  }
  if (f.flight_recorder_entries < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--flight-recorder-entries=", f.flight_recorder_entries, " must be >= 1"));
  }
  if (f.nnodes > 1) {
    // The agents meet at discovery's rendezvous address: it must resolve, and
    // the default (this host) is no use to the other nodes.
    absl::StatusOr<Master> master = ResolveMaster(f.rank, env);
    if (!master.ok()) return master.status();
    if (!master->addr_given) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nnodes=", f.nnodes, " needs --master-addr (or MASTER_ADDR): node 0's address, the "
          "same on every node"));
    }
  }
  if (f.nnodes > 1 && f.rendezvous_secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nnodes=", f.nnodes, " needs the job's secret, the same on every node: "
        "--rendezvous-secret=S or LOOM_RENDEZVOUS_SECRET=S (make one with "
        "`openssl rand -hex 32`)"));
  }
  return absl::OkStatus();
}

absl::Status CheckAgentFlags(const CommFlags& f) { return CheckAgentFlags(f, RealEnv()); }

LaunchRequest LaunchRequestFor(const CommFlags& f) {
  LaunchRequest r;
  r.backend = f.backend;
  r.rank = f.rank;
  if (f.nproc_per_node_given) r.nproc_per_node = f.nproc_per_node;
  r.nnodes = f.nnodes;
  r.supervised = f.max_restarts > 0 || f.heartbeat_timeout_s > 0;
  if (f.nnodes > 1) r.agent_flags.push_back(absl::StrCat("--nnodes=", f.nnodes));
  if (f.max_restarts > 0) r.agent_flags.push_back(absl::StrCat("--max-restarts=", f.max_restarts));
  if (f.heartbeat_timeout_s > 0) {
    r.agent_flags.push_back(absl::StrCat("--heartbeat-timeout-s=", f.heartbeat_timeout_s));
  }
  r.tcp_store = f.store == "tcp";
  r.has_secret = !f.rendezvous_secret.empty();
  return r;
}

LaunchOptions LaunchOptionsFor(const CommFlags& f, const LaunchPlan& plan, const EnvLookup& env) {
  LaunchOptions o;
  o.nproc_per_node = plan.nproc_per_node;
  o.ranks_as_threads = plan.ranks_as_threads;
  o.nnodes = f.nnodes;
  o.node_rank = f.node_rank;
  if (f.nnodes > 1) {
    // The agents meet where discovery puts rank 0. CheckAgentFlags rejected an
    // address that does not resolve; a caller that skipped it gets the default.
    const Master master = ResolveMaster(f.rank, env).value_or(Master{});
    o.master_addr = master.addr;
    o.master_port = master.port;
  } else {
    // One node: rank 0 serves the ranks' store on this host unless a flag says
    // otherwise (port 0: the agent picks a free one).
    if (!f.rank.master_addr.empty()) o.master_addr = f.rank.master_addr;
    if (f.rank.master_port > 0) o.master_port = f.rank.master_port;
  }
  o.secret = f.rendezvous_secret;
  o.max_restarts = f.max_restarts;
  o.heartbeat_timeout = absl::Seconds(f.heartbeat_timeout_s);
  o.timeout = absl::Seconds(f.timeout_s);
  o.dump_flight_recorder = !f.flight_recorder_dir.empty();
  return o;
}

LaunchOptions LaunchOptionsFor(const CommFlags& f, const LaunchPlan& plan) {
  return LaunchOptionsFor(f, plan, RealEnv());
}

}  // namespace loom::comm::launch
