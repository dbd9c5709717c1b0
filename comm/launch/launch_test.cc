#include <cstdlib>
#include <map>
#include <string>

#include "comm/launch/discovery.h"
#include "comm/launch/network.h"
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
  ExplicitRank flags;
  flags.rank = 3;
  flags.world_size = 7;
  auto r = DiscoverRank(flags, Env(all));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 7);
  EXPECT_EQ(r->master_addr, "10.0.0.1");
  EXPECT_EQ(r->master_port, 1234);

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
