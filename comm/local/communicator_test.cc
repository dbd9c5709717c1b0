// The conformance suite on the local backend: world sizes 1-4, ranks as
// threads.
#include "comm/local/communicator.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/testing/conformance.h"
#include "comm/testing/ranks_as_threads.h"
#include "gtest/gtest.h"

namespace loom::comm::local {
namespace {

using testing::Case;

struct Param {
  int world_size;
  Case c;
};

// Runs `body` on every rank of a fresh world (one thread per rank); every
// rank's status.
std::vector<absl::Status> RunWorld(int n, const std::function<absl::Status(Communicator&)>& body,
                                   LocalOptions options = {}) {
  return testing::RunRanksAsThreadsEach(
             n, [&](int, Communicator* c) { return body(*c); }, options)
      .each;
}

class Conformance : public ::testing::TestWithParam<Param> {};

TEST_P(Conformance, Run) {
  const Param& p = GetParam();
  std::vector<absl::Status> st = RunWorld(p.world_size, p.c.body);
  for (int r = 0; r < p.world_size; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
}

std::vector<Param> AllParams() {
  std::vector<Param> out;
  for (int n : {1, 2, 3, 4}) {
    for (const Case& c : testing::Cases()) out.push_back({n, c});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Local, Conformance, ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat(info.param.c.name, "_world",
                                               info.param.world_size);
                         });

// All-to-all's two schedules (every leg at once up to small_bytes moved by a
// rank, pairwise exchange above), and all_to_all_v ranks that choose
// differently (6000: some ranks of a call are below, some above).
TEST(LocalAllToAll, EverySchedule) {
  for (size_t small : {size_t{0}, size_t{6000}, size_t{1} << 30}) {
    LocalOptions o;
    o.small_bytes = small;
    for (int n : {2, 3, 4}) {
      for (const Case& c : testing::Cases()) {
        if (c.name != "AllToAll" && c.name != "AllToAllV") continue;
        std::vector<absl::Status> st = RunWorld(n, c.body, o);
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(st[r].ok()) << c.name << " small_bytes " << small << " world " << n
                                  << " rank " << r << ": " << st[r];
        }
      }
    }
  }
}

// A thread that stops participating makes the others fail with
// DeadlineExceeded within the timeout plus slack, naming the missing ranks.
TEST(LocalDeadPeer, OthersFailWithinTimeout) {
  for (int n : {2, 3, 4}) {
    LocalOptions o;
    o.comm.timeout = absl::Seconds(1);
    std::vector<absl::Status> st = RunWorld(
        n,
        [&](Communicator& c) {
          return testing::DeadPeer(c, n - 1, [] {}, o.comm.timeout, absl::Seconds(3), true);
        },
        o);
    for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "world " << n << " rank " << r << ": " << st[r];
  }
}

// Issue #14, item 2: the conformance suite's failed-op case (comm.h,
// FAILURE): a failed op's buffers, later ops after it.
TEST(LocalFailure, FailedOpKeepsBuffers) {
  for (int n : {2, 3}) {
    LocalOptions o;
    o.comm.timeout = absl::Seconds(1);
    std::vector<absl::Status> st = RunWorld(
        n, [&](Communicator& c) { return testing::FailedOpKeepsBuffers(c, o.comm.timeout); }, o);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(st[r].ok()) << "world " << n << " rank " << r << ": " << st[r];
    }
  }
}

TEST(LocalCreate, BadArguments) {
  MemoryStore store;
  EXPECT_EQ(Create(2, 2, store).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Create(0, 0, store).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Create(0, 2, store).ok());
  // A rank that disagrees about the world size.
  absl::Status s = Create(1, 3, store).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("world has 3 ranks"), std::string::npos) << s;
}

TEST(LocalWork, WaitTimeoutNamesTheOp) {
  LocalOptions o;
  o.comm.timeout = absl::Seconds(2);
  auto world = CreateWorld(2, o);
  ASSERT_TRUE(world.ok());
  auto t = core::Tensor::Empty({4}, core::DType::kF32);
  // Only rank 0 calls: a short Wait reports the op still running.
  WorkPtr w = (*world)[0]->AllReduce(*t, ReduceOp::kSum);
  EXPECT_FALSE(w->Poll());
  absl::Status s = w->Wait(absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("all_reduce #0 in group 'world'"), std::string::npos) << s;
  // The op's own deadline names rank 1.
  s = w->Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("did not arrive: [1]"), std::string::npos) << s;
}

// BarrierWithin outlasts the communicator's op timeout (rank 0 preparing a
// dataset for longer than --comm-timeout-s); a plain Barrier in the same
// situation times out naming the late rank.
TEST(LocalWork, BarrierWithinOutlastsTheOpTimeout) {
  LocalOptions o;
  o.comm.timeout = absl::Milliseconds(300);
  auto late_rank_zero = [](std::function<WorkPtr(Communicator&)> barrier) {
    return [barrier](Communicator& c) {
      if (c.rank() == 0) absl::SleepFor(absl::Milliseconds(900));
      return barrier(c)->Wait();
    };
  };
  std::vector<absl::Status> st = RunWorld(
      3, late_rank_zero([](Communicator& c) { return c.BarrierWithin(absl::Seconds(20)); }), o);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];

  st = RunWorld(3, late_rank_zero([](Communicator& c) { return c.Barrier(); }), o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(st[1])) << st[1];
  EXPECT_NE(st[1].message().find("barrier #0"), std::string::npos) << st[1];
}

}  // namespace
}  // namespace loom::comm::local

namespace loom::comm::local {
namespace {

// Issue #14, item 10b: two Splits running at once over one transport (on
// ranks 0 and 1, of parents X = {0,1,2} and Y = {0,1,3}) used to read the
// same free context id and both take it: the children, which share ranks 0
// and 1, then took each other's messages. Ranks 2 and 3 come late, so on
// ranks 0 and 1 both splits choose while the other is in flight. Each child
// must see only its own group's data.
TEST(LocalSplit, ConcurrentSplitsPickDistinctContexts) {
  LocalOptions o;
  o.comm.timeout = absl::Seconds(20);
  std::vector<absl::Status> st = RunWorld(
      4,
      [](Communicator& world) -> absl::Status {
        const int r = world.rank();
        auto x = world.Split(r == 3 ? -1 : 0, r, "x");
        if (!x.ok()) return x.status();
        auto y = world.Split(r == 2 ? -1 : 0, r, "y");
        if (!y.ok()) return y.status();
        if (r >= 2) absl::SleepFor(absl::Milliseconds(200));
        // In the child of `parent`: all-gathers of (salt, group rank, k).
        auto run = [](Communicator* parent, int salt, absl::Status* out) {
          if (parent == nullptr) return;
          auto child = parent->Split(0, parent->rank(), absl::StrCat("child_of_", salt));
          if (!child.ok()) {
            *out = child.status();
            return;
          }
          Communicator& g = **child;
          for (int k = 0; k < 20 && out->ok(); ++k) {
            auto in = core::Tensor::Empty({3}, core::DType::kI32);
            auto all = core::Tensor::Empty({3 * g.size()}, core::DType::kI32);
            int32_t* mine = in->data<int32_t>();
            mine[0] = salt;
            mine[1] = g.rank();
            mine[2] = k;
            *out = g.AllGather(*in, *all)->Wait(absl::Seconds(20));
            for (int q = 0; q < g.size() && out->ok(); ++q) {
              const int32_t* got = all->data<int32_t>() + 3 * q;
              if (got[0] != salt || got[1] != q || got[2] != k) {
                *out = absl::InternalError(absl::StrCat(
                    "group '", g.group_name(), "' all_gather ", k, ": block ", q, " is (", got[0],
                    ", ", got[1], ", ", got[2], "), expected (", salt, ", ", q, ", ", k,
                    "): another group's message"));
              }
            }
          }
        };
        absl::Status sx, sy;
        std::thread tx(run, x->get(), 1, &sx);
        std::thread ty(run, y->get(), 2, &sy);
        tx.join();
        ty.join();
        return sx.ok() ? sy : sx;
      },
      o);
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
}

// The ring all-reduce at every size (and the small-message algorithms at the
// multi-MiB size) agree with the expectations too.
TEST(LocalAlgorithms, EveryAllReduceAlgorithmAtEverySize) {
  for (size_t small : {size_t{0}, size_t{64} << 20}) {
    for (int n : {2, 3, 4}) {
      LocalOptions o;
      o.small_bytes = small;
      for (const testing::Case& c : testing::Cases()) {
        if (c.name != "AllReduce") continue;
        std::vector<absl::Status> st = RunWorld(n, c.body, o);
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(st[r].ok()) << "small_bytes " << small << " world " << n << " rank " << r
                                  << ": " << st[r];
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::comm::local
