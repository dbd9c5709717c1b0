#include "comm/backends.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "comm/launch/launcher.h"
#include "comm/store/memory_store.h"
#include "comm/testing/ranks_as_threads.h"
#include "gtest/gtest.h"

namespace loom::comm {
namespace {

TEST(Backends, UnknownBackendListsTheBuiltOnes) {
  auto c = Create("gloo", {});
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "built backends: local")) << c.status();
}

TEST(Backends, LocalNeedsAMemoryStore) {
  auto c = Create("local", {});
  EXPECT_TRUE(absl::IsInvalidArgument(c.status()));
  EXPECT_TRUE(absl::StrContains(c.status().message(), "MemoryStore")) << c.status();
}

TEST(Backends, UnknownNetwork) {
  BackendOptions o;
  o.store = std::make_shared<MemoryStore>();
  o.network = "wifi";
  auto c = Create("local", o);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "--network='wifi'")) << c.status();
}

TEST(Backends, LocalThroughTheFactory) {
  const int n = 3;
  auto store = std::make_shared<MemoryStore>();
  std::vector<absl::Status> st = testing::RunThreads(n, [&](int r) -> absl::Status {
    BackendOptions o;
    o.rank = r;
    o.world_size = n;
    o.store = store;
    auto c = Create("local", o);
    if (!c.ok()) return c.status();
    auto t = core::Tensor::Empty({5}, core::DType::kI64);
    for (int i = 0; i < 5; ++i) t->data<int64_t>()[i] = r + i;
    absl::Status s = (*c)->AllReduce(*t, ReduceOp::kSum)->Wait();
    for (int i = 0; i < 5; ++i) {
      if (t->data<int64_t>()[i] != 3 + 3 * i) s = absl::InternalError("wrong sum");
    }
    return s;
  }).each;
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << st[r];
}

TEST(Backends, FromFlagsErrors) {
  launch::CommFlags f;
  f.backend = "local";
  EXPECT_TRUE(absl::IsInvalidArgument(CreateFromFlags(f).status()));
  f.backend = "ucx";
  f.store = "etcd";
  f.rank.rank = 0;
  f.rank.world_size = 1;
  auto c = CreateFromFlags(f);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "--store='etcd'")) << c.status();
}

TEST(Backends, NcclIsListedWhenBuilt) {
  std::vector<std::string> avail = AvailableBackends();
  const bool listed = std::find(avail.begin(), avail.end(), "nccl") != avail.end();
#ifdef LOOM_COMM_HAVE_NCCL
  EXPECT_TRUE(listed);
  auto c = Create("nccl", {});  // no store
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "store")) << c.status();
#else
  EXPECT_FALSE(listed);
  EXPECT_TRUE(absl::IsUnimplemented(Create("nccl", {}).status()));
#endif
}

#ifdef LOOM_COMM_HAVE_UCX
TEST(Backends, UnreachableStoreAddress) {
  auto port = launch::PickFreePort();
  ASSERT_TRUE(port.ok());
  launch::CommFlags f;
  f.backend = "ucx";
  f.store = "tcp";
  f.timeout_s = 0.5;  // also the connect timeout
  f.rank.rank = 1;    // a client: rank 0 is not running
  f.rank.world_size = 2;
  f.rank.master_addr = "127.0.0.1";
  f.rank.master_port = *port;
  f.rendezvous_secret = "backends-test-secret";
  auto c = CreateFromFlags(f);
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "could not connect")) << c.status();
}
#endif

}  // namespace
}  // namespace loom::comm
