#include "profile/profiler.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "profile/chrome_trace.h"

namespace loom::profile {
namespace {

using nlohmann::json;

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Two local ranks: an all-reduce before the window (not recorded), then in
// it an all-reduce of 1024 f32 and a send 0 -> 1 of 16 f32.
TEST(ProfilerTest, CommOpsInsideTheWindowWithBytesAndPeers) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/prof";
  absl::Status s = comm::testing::RunRanksAsThreads(2, [&](int rank, comm::Communicator* c) {
    ProfileOptions o;
    o.dir = dir;
    o.step_start = 1;
    o.step_end = 2;
    absl::StatusOr<std::unique_ptr<Profiler>> p = Profiler::Create(o, rank);
    if (!p.ok()) return p.status();
    auto t = core::Tensor::Zeros(core::Shape{1024}, core::DType::kF32);
    auto small = core::Tensor::Zeros(core::Shape{16}, core::DType::kF32);
    if (!t.ok() || !small.ok()) return absl::InternalError("alloc");
    for (int64_t it = 0; it < 2; ++it) {
      absl::Status st = (*p)->BeforeStep(it, c);
      if (!st.ok()) return st;
      st = c->AllReduce(*t, comm::ReduceOp::kSum)->Wait();
      if (!st.ok()) return st;
      if (it == 1) {
        st = (rank == 0 ? c->Send(*small, 1, 7) : c->Recv(*small, 0, 7))->Wait();
        if (!st.ok()) return st;
      }
      st = (*p)->AfterStep(it + 1, c, nullptr);
      if (!st.ok()) return st;
    }
    if (!(*p)->closed()) return absl::InternalError("window not closed");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;

  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<RankTrace> t =
        ParseRankTrace(Read(absl::StrCat(dir, "/rank-", r, ".json")), "rank file");
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->events.size(), 2u) << "one all-reduce and one send/recv in the window";
    const Event& ar = t->events[0];
    EXPECT_EQ(ar.name, "all_reduce");
    EXPECT_EQ(ar.cat, "comm");
    EXPECT_EQ(ar.track, "comm world");
    EXPECT_GE(ar.ts_us, t->sync_us);
    json a = json::parse(ar.args);
    EXPECT_EQ(a["bytes"], 4096);
    EXPECT_EQ(a["dtype"], "f32");
    EXPECT_EQ(a["group"], "world");
    EXPECT_EQ(a["ranks"], json::parse("[0,1]"));
    const Event& p2p = t->events[1];
    EXPECT_EQ(p2p.name, r == 0 ? "send" : "recv");
    EXPECT_EQ(p2p.cat, "p2p");
    json b = json::parse(p2p.args);
    EXPECT_EQ(b["bytes"], 64);
    EXPECT_EQ(b["peer"], 1 - r);
    EXPECT_EQ(b["tag"], 7);
  }
  absl::StatusOr<ParsedTrace> merged = ParseTrace(Read(dir + "/trace.json"), "trace.json");
  ASSERT_TRUE(merged.ok()) << merged.status();
  std::set<int> pids;
  for (const Event& e : merged->events) pids.insert(e.pid);
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_EQ(merged->events.size(), 4u);
  ASSERT_EQ(merged->processes.size(), 2u);
  EXPECT_EQ(merged->processes[1].second, "rank 1");
}

TEST(ProfilerTest, NeedsADirAndOneProfilerPerRank) {
  EXPECT_FALSE(Profiler::Create(ProfileOptions{}, 0).ok());
  ProfileOptions o;
  o.dir = std::string(std::getenv("TEST_TMPDIR")) + "/twice";
  absl::StatusOr<std::unique_ptr<Profiler>> a = Profiler::Create(o, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(Profiler::Create(o, 5).ok());
  a->reset();
  EXPECT_TRUE(Profiler::Create(o, 5).ok());  // released with the first
}

}  // namespace
}  // namespace loom::profile
