#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "comm/launch/discovery.h"
#include "comm/launch/network.h"
#include "comm/launch/plan.h"
#include "gtest/gtest.h"

namespace loom::comm::launch {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

TEST(DiscoverRank, Order) {
  const std::map<std::string, std::string> all = {
      {"RANK", "1"},         {"WORLD_SIZE", "4"},       {"LOCAL_RANK", "1"},
      {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "8"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"},
      {"SLURM_LOCALID", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}};
  // Flags first (they must agree with every launcher's variables: below).
  auto no_launchers = std::map<std::string, std::string>{{"MASTER_ADDR", "10.0.0.1"},
                                                         {"MASTER_PORT", "1234"}};
  ExplicitRank flags;
  flags.rank = 3;
  flags.world_size = 7;
  auto r = DiscoverRank(flags, Env(no_launchers));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 7);
  EXPECT_EQ(r->master_addr, "10.0.0.1");
  EXPECT_EQ(r->master_port, 1234);
  EXPECT_EQ(r->from, RankSource::kFlags);

  r = DiscoverRank({}, Env(all));
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_NE(r->source.find("torchrun"), std::string::npos);

  auto no_torch = all;
  no_torch.erase("RANK");
  no_torch.erase("WORLD_SIZE");
  r = DiscoverRank({}, Env(no_torch));
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 0);

  r = DiscoverRank({}, Env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world_size, 6);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->master_addr, "127.0.0.1");
  EXPECT_EQ(r->master_port, 29500);

  r = DiscoverRank({}, Env({}));
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->world_size, 1);

  ExplicitRank addr;
  addr.master_addr = "h";
  addr.master_port = 99;
  r = DiscoverRank(addr, Env(all));
  EXPECT_EQ(r->master_addr, "h");
  EXPECT_EQ(r->master_port, 99);
}

TEST(DiscoverRank, Errors) {
  auto r = DiscoverRank({}, Env({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("RANK='x1'"), std::string::npos) << r.status();
  r = DiscoverRank({}, Env({{"RANK", "2"}, {"WORLD_SIZE", "2"}}));
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status();
  r = DiscoverRank({}, Env({{"RANK", "0"}}));
  EXPECT_NE(r.status().message().find("WORLD_SIZE"), std::string::npos) << r.status();
  ExplicitRank half;
  half.rank = 1;
  EXPECT_FALSE(DiscoverRank(half, Env({})).ok());
  r = DiscoverRank({}, Env({{"MASTER_PORT", "99999"}}));
  EXPECT_NE(r.status().message().find("MASTER_PORT"), std::string::npos) << r.status();
  // Half a launcher's variables: name the one that is missing.
  r = DiscoverRank({}, Env({{"WORLD_SIZE", "2"}}));
  EXPECT_TRUE(absl::StrContains(r.status().message(), "WORLD_SIZE=2 is set but RANK is not"))
      << r.status();
  r = DiscoverRank({}, Env({{"OMPI_COMM_WORLD_RANK", "1"}}));
  EXPECT_TRUE(absl::StrContains(r.status().message(), "OMPI_COMM_WORLD_SIZE")) << r.status();
  r = DiscoverRank({}, Env({{"SLURM_NTASKS", "4"}}));
  EXPECT_TRUE(absl::StrContains(r.status().message(), "SLURM_PROCID")) << r.status();
  r = DiscoverRank({}, Env({{"LOCAL_RANK", "0"}}));
  EXPECT_TRUE(absl::StrContains(r.status().message(), "RANK and WORLD_SIZE are not")) << r.status();
  ExplicitRank local_only;
  local_only.local_rank = 1;
  r = DiscoverRank(local_only, Env({}));
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--local-rank=1")) << r.status();
}

// A launcher chose this process's place: flags may repeat it, never change it.
TEST(DiscoverRank, FlagsThatDisagreeWithTheLauncherAreRefused) {
  const auto torchrun = Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  ExplicitRank same;
  same.rank = 1;
  same.world_size = 2;
  auto r = DiscoverRank(same, torchrun);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->world_size, 2);

  ExplicitRank bigger = same;
  bigger.world_size = 4;
  r = DiscoverRank(bigger, torchrun);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "--world-size=4 disagrees with WORLD_SIZE=2 from torchrun"))
      << r.status();
  ExplicitRank alone;  // half of the pair: torchrun's world, if it agrees
  alone.world_size = 4;
  r = DiscoverRank(alone, torchrun);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--world-size=4 disagrees with WORLD_SIZE=2"))
      << r.status();
  alone.world_size = 2;
  r = DiscoverRank(alone, torchrun);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->from, RankSource::kTorchrun);

  ExplicitRank other_local = same;
  other_local.local_rank = 0;
  r = DiscoverRank(other_local, torchrun);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--local-rank=0 disagrees with LOCAL_RANK=1"))
      << r.status();
}

// torchrun's agent serves its store on MASTER_ADDR:MASTER_PORT and says so.
TEST(DiscoverRank, TorchrunsAgentStore) {
  std::map<std::string, std::string> vars = {
      {"RANK", "0"},          {"WORLD_SIZE", "2"},          {"LOCAL_RANK", "0"},
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29533"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RUN_ID", "job7"},
      {"TORCHELASTIC_RESTART_COUNT", "1"}};
  auto r = DiscoverRank({}, Env(vars));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->torchrun_agent_store);
  EXPECT_EQ(r->torchrun_run_id, "job7");
  EXPECT_EQ(r->torchrun_restart_count, 1);
  EXPECT_EQ(r->master_port, 29533);

  // torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: nobody serves there,
  // rank 0 does as under any other launcher.
  auto no_agent = vars;
  no_agent["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  r = DiscoverRank({}, Env(no_agent));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->torchrun_agent_store);

  // --master-addr/--master-port point elsewhere: not the agent's store.
  ExplicitRank moved;
  moved.master_port = 40000;
  r = DiscoverRank(moved, Env(vars));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->torchrun_agent_store);

  auto half = vars;
  half.erase("MASTER_PORT");
  r = DiscoverRank({}, Env(half));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "MASTER_PORT is not set")) << r.status();

  auto bad = vars;
  bad["TORCHELASTIC_RESTART_COUNT"] = "one";
  r = DiscoverRank({}, Env(bad));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "TORCHELASTIC_RESTART_COUNT='one'"))
      << r.status();
}

// The multi-node agents' address (flags.cc's CheckAgentFlags and
// LaunchOptionsFor take it from here): flags, else MASTER_ADDR/MASTER_PORT,
// else the default port; only a given address will do across nodes.
TEST(ResolveMaster, FlagsThenEnvironmentThenDefault) {
  auto m = ResolveMaster({}, Env({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->addr, "10.0.0.1");
  EXPECT_EQ(m->port, 29400);
  EXPECT_TRUE(m->addr_given);

  m = ResolveMaster({}, Env({{"MASTER_ADDR", "10.0.0.1"}}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->addr, "10.0.0.1");
  EXPECT_EQ(m->port, 29500);

  m = ResolveMaster({}, Env({{"MASTER_ADDR", ""}}));  // set but empty: not given
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->addr, "127.0.0.1");
  EXPECT_EQ(m->port, 29500);
  EXPECT_FALSE(m->addr_given);

  ExplicitRank flags;
  flags.master_addr = "h";
  flags.master_port = 99;
  m = ResolveMaster(flags, Env({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->addr, "h");
  EXPECT_EQ(m->port, 99);
  EXPECT_TRUE(m->addr_given);

  m = ResolveMaster({}, Env({{"MASTER_PORT", "x"}}));
  EXPECT_TRUE(absl::StrContains(m.status().message(), "MASTER_PORT='x'")) << m.status();
  flags.master_port = 0;  // "pick a free one" is no address to meet at
  m = ResolveMaster(flags, Env({}));
  EXPECT_TRUE(absl::StrContains(m.status().message(), "--master-port")) << m.status();
}

TEST(DiscoverRank, LocalWorldSize) {
  auto r = DiscoverRank({}, Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                 {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->local_world_size, 2);
  EXPECT_EQ(r->from, RankSource::kTorchrun);
  r = DiscoverRank({}, Env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->local_world_size, 4);
  EXPECT_EQ(r->from, RankSource::kOpenMpi);
  // Slurm: "2(x3),1" is 2 tasks on each of nodes 0-2 and 1 on node 3.
  std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"},
                                              {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                                              {"SLURM_NODEID", "3"}};
  r = DiscoverRank({}, Env(slurm));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->local_world_size, 1);
  EXPECT_EQ(r->from, RankSource::kSlurm);
  slurm["SLURM_NODEID"] = "1";
  EXPECT_EQ(DiscoverRank({}, Env(slurm))->local_world_size, 2);
  slurm["SLURM_STEP_TASKS_PER_NODE"] = "5";
  slurm["SLURM_NODEID"] = "0";
  EXPECT_EQ(DiscoverRank({}, Env(slurm))->local_world_size, 5);
  EXPECT_EQ(DiscoverRank({}, Env({}))->local_world_size, 1);
}

// The launch decision for each way a process can be started.
LaunchRequest Request(const std::string& backend, std::optional<int> nproc = std::nullopt) {
  LaunchRequest r;
  r.backend = backend;
  r.backend_flag = "--distributed-backend";
  r.nproc_per_node = nproc;
  r.default_nproc_per_node = 2;  // //train:gpt's
  r.program = "bazel-bin/train/gpt";
  r.args = {"--distributed-backend=" + backend, "--train-iters=5"};
  if (nproc) r.args.push_back("--nproc-per-node=" + std::to_string(*nproc));
  r.has_secret = true;  // LOOM_RENDEZVOUS_SECRET (see ExternalRanksNeedTheSecret)
  return r;
}

TEST(PlanLaunch, NobodyStartedThisProcess) {
  auto p = PlanLaunch(Request("ucx"), Env({}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kLauncher);  // the binary's default: 2 ranks
  EXPECT_EQ(p->nproc_per_node, 2);
  EXPECT_EQ(p->world_size, 2);
  p = PlanLaunch(Request("ucx", 4), Env({}));
  EXPECT_EQ(p->role, Role::kLauncher);
  EXPECT_EQ(p->world_size, 4);
  p = PlanLaunch(Request("ucx", 1), Env({}));
  EXPECT_EQ(p->role, Role::kRank);
  EXPECT_EQ(p->world_size, 1);
  EXPECT_EQ(p->rank.from, RankSource::kSingleProcess);
  p = PlanLaunch(Request("local", 3), Env({}));
  EXPECT_EQ(p->role, Role::kThreads);
  EXPECT_EQ(p->nproc_per_node, 3);
  EXPECT_EQ(p->world_size, 3);
  p = PlanLaunch(Request("ucx", 0), Env({}));
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--nproc-per-node=0")) << p.status();
}

TEST(PlanLaunch, TorchrunEnvJoinsThatWorld) {
  // The report: two hosts, torchrun's variables, no --nproc-per-node.
  const std::map<std::string, std::string> env = {{"RANK", "1"}, {"WORLD_SIZE", "2"},
                                                  {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "10.0.0.1"},
                                                  {"MASTER_PORT", "29400"}};
  auto p = PlanLaunch(Request("ucx"), Env(env));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kRank);  // never starts ranks of its own
  EXPECT_EQ(p->world_size, 2);
  EXPECT_EQ(p->rank.rank, 1);
  EXPECT_EQ(p->rank.local_rank, 0);
  EXPECT_EQ(p->rank.master_addr, "10.0.0.1");
  EXPECT_EQ(p->rank.master_port, 29400);
  // --nproc-per-node=1 agrees with being one rank; more is an error naming both.
  EXPECT_EQ(PlanLaunch(Request("ucx", 1), Env(env))->role, Role::kRank);
  p = PlanLaunch(Request("ucx", 2), Env(env));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--nproc-per-node=2")) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "RANK=1, WORLD_SIZE=2")) << p.status();
  // Part of the set: name what is missing; never fall back to starting ranks.
  p = PlanLaunch(Request("ucx"), Env({{"RANK", "1"}, {"MASTER_ADDR", "h"}}));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "RANK=1 is set but WORLD_SIZE is not"))
      << p.status();
  // Threads cannot join a multi-process world.
  p = PlanLaunch(Request("local"), Env(env));
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--distributed-backend=local")) << p.status();
  // MPI would make each a world of its own.
  p = PlanLaunch(Request("mpi"), Env(env));
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--distributed-backend=mpi")) << p.status();
}

TEST(PlanLaunch, FlagsJoinThatWorld) {
  LaunchRequest r = Request("ucx");
  r.rank.rank = 0;
  r.rank.world_size = 3;
  auto p = PlanLaunch(r, Env({}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kRank);
  EXPECT_EQ(p->world_size, 3);
  EXPECT_EQ(p->rank.from, RankSource::kFlags);
  r.nproc_per_node = 3;
  p = PlanLaunch(r, Env({}));
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--rank=0, --world-size=3")) << p.status();
  r = Request("ucx");
  r.rank.rank = 1;  // without --world-size
  EXPECT_TRUE(absl::StrContains(PlanLaunch(r, Env({})).status().message(), "--world-size"));
}

TEST(PlanLaunch, OpenMpiEnvJoinsThatWorld) {
  const std::map<std::string, std::string> env = {
      {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  for (const char* backend : {"mpi", "ucx"}) {
    auto p = PlanLaunch(Request(backend), Env(env));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->role, Role::kRank);
    EXPECT_EQ(p->world_size, 4);
    EXPECT_EQ(p->rank.local_world_size, 4);
    EXPECT_EQ(p->rank.from, RankSource::kOpenMpi);
  }
  auto p = PlanLaunch(Request("mpi", 4), Env(env));
  EXPECT_TRUE(absl::StrContains(p.status().message(), "OMPI_COMM_WORLD_SIZE=4")) << p.status();
}

TEST(PlanLaunch, SlurmEnvJoinsThatWorld) {
  const std::map<std::string, std::string> env = {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"},
                                                  {"SLURM_LOCALID", "1"},
                                                  {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"},
                                                  {"SLURM_NODEID", "1"}};
  auto p = PlanLaunch(Request("ucx"), Env(env));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kRank);
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->rank.local_rank, 1);
  EXPECT_EQ(p->rank.local_world_size, 2);
  EXPECT_EQ(PlanLaunch(Request("mpi"), Env(env))->role, Role::kRank);  // srun starts MPI ranks
  EXPECT_FALSE(PlanLaunch(Request("ucx", 2), Env(env)).ok());
}

TEST(PlanLaunch, OurOwnLaunchersChildren) {
  // The launcher re-executes the command line, --nproc-per-node included.
  const std::map<std::string, std::string> env = {
      {"RANK", "1"},        {"WORLD_SIZE", "4"},          {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "4000"},
      {"LOOM_LAUNCHED", "1"}};
  auto p = PlanLaunch(Request("ucx", 4), Env(env));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kRank);
  EXPECT_EQ(p->rank.rank, 1);
  EXPECT_EQ(p->rank.local_world_size, 4);
}

TEST(PlanLaunch, ExternalRanksNeedTheSecret) {
  const std::map<std::string, std::string> env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  LaunchRequest r = Request("ucx");
  r.has_secret = false;
  auto p = PlanLaunch(r, Env(env));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "LOOM_RENDEZVOUS_SECRET")) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--rendezvous-secret")) << p.status();
  r.tcp_store = false;  // --store=file:DIR: the folder's permissions guard it
  EXPECT_TRUE(PlanLaunch(r, Env(env)).ok());
  r.tcp_store = true;
  EXPECT_TRUE(PlanLaunch(r, Env({{"RANK", "0"}, {"WORLD_SIZE", "1"}})).ok());  // nobody to meet
  // Our own agent hands its ranks the secret in the environment.
  auto child = env;
  child["LOOM_LAUNCHED"] = "1";
  EXPECT_TRUE(PlanLaunch(r, Env(child)).ok());
}

TEST(PlanLaunch, TheAgentsFlags) {
  LaunchRequest r = Request("ucx", 4);
  r.nnodes = 3;
  auto p = PlanLaunch(r, Env({}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kLauncher);
  EXPECT_EQ(p->world_size, 12);
  EXPECT_EQ(p->nproc_per_node, 4);
  // One supervised rank still needs an agent.
  r = Request("ucx", 1);
  r.supervised = true;
  EXPECT_EQ(PlanLaunch(r, Env({}))->role, Role::kLauncher);
  // local: one supervised process running the ranks as threads ...
  r = Request("local", 8);
  r.supervised = true;
  p = PlanLaunch(r, Env({}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kLauncher);
  EXPECT_TRUE(p->ranks_as_threads);
  EXPECT_EQ(p->world_size, 8);
  // ... which is that process, told by the agent how many threads to run.
  p = PlanLaunch(r, Env({{"LOOM_LAUNCHED", "1"}, {"LOOM_LOCAL_THREADS", "8"}}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kThreads);
  EXPECT_EQ(p->nproc_per_node, 8);
  // local cannot span nodes; mpirun's ranks are not the agent's.
  r = Request("local", 2);
  r.nnodes = 2;
  EXPECT_TRUE(absl::StrContains(PlanLaunch(r, Env({})).status().message(), "--nnodes=2"));
  r = Request("mpi");
  r.supervised = true;
  EXPECT_TRUE(absl::StrContains(PlanLaunch(r, Env({})).status().message(), "mpirun"));
  // Ranks someone else started are restarted by that launcher, not by us.
  r = Request("ucx");
  r.supervised = true;
  p = PlanLaunch(r, Env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "--max-restarts")) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "SLURM_PROCID=0")) << p.status();
}

TEST(PlanLaunch, WithoutFlags) {
  EXPECT_EQ(WithoutFlags({"prog", "--master_addr=h", "--master-port", "9", "--x=1", "--",
                          "--master_port=3"},
                         {"master_addr", "master_port"}),
            (std::vector<std::string>{"prog", "--x=1", "--", "--master_port=3"}));
}

TEST(PlanLaunch, MpiRanksComeFromMpirun) {
  LaunchRequest r = Request("mpi", 4);
  r.args = {"--nproc-per-node", "4", "--distributed-backend=mpi", "--data-path=/d/x y",
            "--tensor-model-parallel-size=2"};
  auto p = PlanLaunch(r, Env({}));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(
      p.status().message(), "mpirun -np 4 bazel-bin/train/gpt --distributed-backend=mpi "
                            "'--data-path=/d/x y' --tensor-model-parallel-size=2"))
      << p.status();
  // The binary's default (2) outside mpirun: a 1-rank MPI world, and a note saying how to get 2.
  p = PlanLaunch(Request("mpi"), Env({}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kRank);
  EXPECT_EQ(p->world_size, 1);
  EXPECT_TRUE(absl::StrContains(p->note, "mpirun -np 2")) << p->note;
  EXPECT_TRUE(PlanLaunch(Request("mpi", 1), Env({}))->note.empty());
}

TEST(PlanLaunch, WithoutNprocPerNode) {
  EXPECT_EQ(WithoutNprocPerNode({"--a=1", "--nproc_per_node=2", "--nproc-per-node", "3", "-b",
                                 "--", "--nproc-per-node=4"}),
            (std::vector<std::string>{"--a=1", "-b", "--", "--nproc-per-node=4"}));
}

TEST(Network, Table) {
  using V = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(*NetworkSettings("ethernet", "ucx"), (V{{"UCX_TLS", "sm,self,tcp"}}));
  EXPECT_EQ(*NetworkSettings("infiniband", "ucx"), (V{{"UCX_TLS", "rc,ud,sm,self"}}));
  EXPECT_EQ(*NetworkSettings("ethernet", "mpi"),
            (V{{"OMPI_MCA_pml", "ob1"}, {"OMPI_MCA_btl", "tcp,self,vader"}}));
  EXPECT_EQ(*NetworkSettings("infiniband", "mpi"), (V{{"OMPI_MCA_pml", "ucx"}}));
  EXPECT_TRUE(NetworkSettings("auto", "ucx")->empty());
  EXPECT_TRUE(NetworkSettings("infiniband", "local")->empty());
  auto bad = NetworkSettings("wifi", "ucx");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("--network='wifi'"), std::string::npos);
  EXPECT_FALSE(NetworkSettings("auto", "gloo").ok());
}

TEST(Network, Nccl) {
  using V = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(*NetworkSettings("ethernet", "nccl"),
            (V{{"NCCL_IB_DISABLE", "1"}, {"NCCL_NET", "Socket"}}));
  EXPECT_EQ(*NetworkSettings("infiniband", "nccl"),
            (V{{"NCCL_IB_DISABLE", "0"}, {"NCCL_NET", "IB"}}));
  EXPECT_TRUE(NetworkSettings("auto", "nccl")->empty());  // NCCL's defaults
  EXPECT_TRUE(absl::IsInvalidArgument(NetworkSettings("wifi", "nccl").status()));
}

TEST(Network, NcclUserSettingsWin) {
  setenv("NCCL_NET", "MyPlugin", 1);
  unsetenv("NCCL_IB_DISABLE");
  ASSERT_TRUE(ApplyNetworkSettings("ethernet", "nccl").ok());
  EXPECT_STREQ(getenv("NCCL_NET"), "MyPlugin");    // the user's value stays
  EXPECT_STREQ(getenv("NCCL_IB_DISABLE"), "1");    // unset: ours
  unsetenv("NCCL_NET");
  unsetenv("NCCL_IB_DISABLE");
  ASSERT_TRUE(ApplyNetworkSettings("auto", "nccl").ok());
  EXPECT_EQ(getenv("NCCL_NET"), nullptr);
  EXPECT_EQ(getenv("NCCL_IB_DISABLE"), nullptr);
}

}  // namespace
}  // namespace loom::comm::launch
