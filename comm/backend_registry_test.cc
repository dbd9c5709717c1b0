#include "comm/backend_registry.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "comm/backends.h"
#include "gtest/gtest.h"

namespace loom::comm {
namespace {

bool Has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(BackendRegistry, KnowsEveryBackendAndBuiltTheOnesFoundHere) {
  EXPECT_EQ(KnownBackends(), (std::vector<std::string>{"local", "mpi", "nccl", "ucx"}));
  const std::vector<std::string> built = BuiltBackends();
  EXPECT_TRUE(Has(built, "local"));
#ifdef LOOM_COMM_HAVE_MPI
  EXPECT_TRUE(Has(built, "mpi"));
#else
  EXPECT_FALSE(Has(built, "mpi"));
#endif
#ifdef LOOM_COMM_HAVE_UCX
  EXPECT_TRUE(Has(built, "ucx"));
#else
  EXPECT_FALSE(Has(built, "ucx"));
#endif
#ifdef LOOM_COMM_HAVE_NCCL
  EXPECT_TRUE(Has(built, "nccl"));
#else
  EXPECT_FALSE(Has(built, "nccl"));
#endif
  for (const std::string& name : built) EXPECT_NE(FindFactory(name), nullptr) << name;
  EXPECT_EQ(AvailableBackends(), built);
}

TEST(BackendRegistry, LookupByName) {
  const BackendInfo* local = FindBackend("local");
  ASSERT_NE(local, nullptr);
  EXPECT_EQ(local->launched_by, LaunchedBy::kThreads);
  EXPECT_EQ(FindBackend("mpi")->launched_by, LaunchedBy::kMpirun);
  EXPECT_FALSE(FindBackend("mpi")->needs_store);
  EXPECT_EQ(FindBackend("ucx")->launched_by, LaunchedBy::kProcesses);
  EXPECT_TRUE(FindBackend("ucx")->needs_store);
  EXPECT_EQ(FindBackend("nccl")->device, BackendDevice::kCuda);
  EXPECT_EQ(BackendsOn(BackendDevice::kCuda), std::vector<std::string>{"nccl"});
  EXPECT_EQ(FindBackend("gloo"), nullptr);
  EXPECT_EQ(FindFactory("gloo"), nullptr);
}

TEST(BackendRegistry, UnknownNameListsTheBuiltBackends) {
  absl::StatusOr<const BackendInfo*> b = LookupBackend("gloo", "--distributed-backend");
  ASSERT_TRUE(absl::IsInvalidArgument(b.status())) << b.status();
  const std::string want = "--distributed-backend='gloo' is not one of the built backends: " +
                           absl::StrJoin(BuiltBackends(), ", ");
  EXPECT_TRUE(absl::StartsWith(b.status().message(), want)) << b.status();
  EXPECT_TRUE(LookupBuiltBackend("local").ok());
}

TEST(BackendRegistry, NetworkTablesComeFromTheBackends) {
  using V = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(FindBackend("ucx")->network.at("ethernet"), (V{{"UCX_TLS", "sm,self,tcp"}}));
  EXPECT_TRUE(FindBackend("local")->network.empty());
  for (const std::string& name : KnownBackends()) {
    for (const auto& [network, settings] : FindBackend(name)->network) {
      EXPECT_TRUE(network == "ethernet" || network == "infiniband") << name << " " << network;
      EXPECT_FALSE(settings.empty()) << name << " " << network;
    }
  }
}

TEST(BackendRegistry, ConformanceTraits) {
  EXPECT_TRUE(FindBackend("local")->conformance.detects_mismatch);
  EXPECT_TRUE(FindBackend("ucx")->conformance.detects_mismatch);
  EXPECT_FALSE(FindBackend("mpi")->conformance.detects_mismatch);
  EXPECT_TRUE(FindBackend("mpi")->conformance.one_world_per_process);
  EXPECT_FALSE(FindBackend("nccl")->conformance.detects_mismatch);
}

}  // namespace
}  // namespace loom::comm
