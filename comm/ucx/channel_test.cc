// The ucx backend's same-host channel (shm_channel.h) inside the transport,
// ranks as threads of this process: the paths where a message and its
// receive take different routes (UCX for one, the channel for the other),
// and what the channel leaves in /dev/shm.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/store/memory_store.h"
#include "comm/testing/ranks_as_threads.h"
#include "comm/ucx/communicator.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace loom::comm::ucx {
namespace {

using core::DType;
using core::Tensor;

constexpr size_t kLimit = 1024;  // the channel's limit in these tests

UcxOptions Options(size_t channel_bytes) {
  UcxOptions o;
  o.comm.timeout = absl::Seconds(20);
  o.connect_timeout = absl::Seconds(10);
  o.same_host_channel_bytes = channel_bytes;
  return o;
}

void ExpectOk(const std::vector<absl::Status>& each) {
  for (size_t r = 0; r < each.size(); ++r) {
    EXPECT_TRUE(each[r].ok()) << "rank " << r << ": " << each[r];
  }
}

// fn(rank, world) on 2 threads, each rank of one ucx world; every rank's status.
std::vector<absl::Status> RunWorld(const UcxOptions& o,
                                   const std::function<absl::Status(int, Communicator&)>& fn) {
  auto store = std::make_shared<MemoryStore>();
  auto rank = [&](int r) -> absl::Status {
    auto world = Create(r, 2, store, o);
    if (!world.ok()) return world.status();
    return fn(r, **world);
  };
  return testing::RunThreads(2, rank).each;
}

Tensor Iota(int64_t n, float base) {
  Tensor t = *Tensor::Empty({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = base + static_cast<float>(i);
  return t;
}

std::vector<std::string> OurShmNames() {
  std::vector<std::string> out;
  const std::string prefix = absl::StrCat("loom-ucx-", getpid(), "-");
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (absl::StartsWith(e->d_name, prefix)) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

// Every send synchronous (flow control at its tightest): small messages
// leave a stub on the channel and travel on UCX, whose receive is posted
// when the stub meets it.
TEST(UcxChannel, SendsThatCatchUpTravelOnUcx) {
  UcxOptions o = Options(kLimit);
  o.max_bytes_ahead = 1;
  ExpectOk(RunWorld(o, [](int r, Communicator& world) -> absl::Status {
    for (int k = 0; k < 50; ++k) {
      Tensor t = Iota(16, static_cast<float>(r + k));
      if (absl::Status s = world.AllReduce(t, ReduceOp::kSum)->Wait(); !s.ok()) return s;
      if (t.data<float>()[3] != static_cast<float>(2 * k + 1 + 2 * 3)) {
        return absl::InternalError(absl::StrCat("wrong sum at op ", k));
      }
      Tensor m = Iota(8, r == 0 ? k : -1);
      absl::Status s = r == 0 ? world.Send(m, 1, 3)->Wait() : world.Recv(m, 0, 3)->Wait();
      if (!s.ok()) return s;
      if (m.data<float>()[7] != static_cast<float>(k + 7)) {
        return absl::InternalError(absl::StrCat("wrong message at op ", k));
      }
    }
    return absl::OkStatus();
  }));
}

// Counts that differ across the limit (the message on UCX, its receive on
// the channel, or the reverse) fail as they do with the channel off: the
// same InvalidArgument on each rank, no timeout.
TEST(UcxChannel, LengthsDifferingAcrossTheLimitFailAsOnUcx) {
  struct Case {
    const char* name;
    std::function<absl::Status(int, Communicator&)> fn;
  };
  const Case cases[] = {
      {"all_reduce of 100 and 1000 floats",
       [](int r, Communicator& world) {
         Tensor t = Iota(r == 0 ? 100 : 1000, 0);
         return world.AllReduce(t, ReduceOp::kSum)->Wait();
       }},
      {"send 2000 bytes, receive 800",
       [](int r, Communicator& world) {
         Tensor t = Iota(r == 0 ? 500 : 200, 0);
         return r == 0 ? world.Send(t, 1, 1)->Wait() : world.Recv(t, 0, 1)->Wait();
       }},
      {"send 800 bytes, receive 2000",
       [](int r, Communicator& world) {
         Tensor t = Iota(r == 0 ? 200 : 500, 0);
         if (r == 0) return world.Send(t, 1, 1)->Wait();
         return world.Recv(t, 0, 1)->Wait();
       }},
  };
  for (const Case& c : cases) {
    const std::vector<absl::Status> ucx = RunWorld(Options(0), c.fn);
    const std::vector<absl::Status> channel = RunWorld(Options(kLimit), c.fn);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(channel[r], ucx[r]) << c.name << ", rank " << r;
      if (!ucx[r].ok()) {
        EXPECT_TRUE(absl::IsInvalidArgument(ucx[r])) << c.name << ": " << ucx[r];
      }
    }
    EXPECT_FALSE(ucx[1].ok()) << c.name;
  }
}

// One tag, messages on both sides of the limit, receives posted before the
// messages come (one batch) and after: each receive gets its own message.
TEST(UcxChannel, OneTagAcrossTheLimitKeepsTheOrderSent) {
  const std::vector<int64_t> counts = {8, 1000, 8, 2000, 300, 4};  // floats
  ExpectOk(RunWorld(Options(kLimit), [&](int r, Communicator& world) {
    std::vector<Tensor> t;
    for (size_t i = 0; i < counts.size(); ++i) {
      t.push_back(Iota(counts[i], r == 0 ? 100.0f * i : -1));
    }
    if (r == 0) {
      absl::SleepFor(absl::Milliseconds(100));  // the first batch is posted by then
      for (const Tensor& m : t) {
        if (absl::Status s = world.Send(m, 1, 7)->Wait(); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    std::vector<P2POp> first;
    for (size_t i = 0; i < 3; ++i) first.push_back({P2POp::Kind::kRecv, t[i], 0, 7});
    if (absl::Status s = world.BatchSendRecv(first)->Wait(); !s.ok()) return s;
    for (size_t i = 3; i < t.size(); ++i) {
      if (absl::Status s = world.Recv(t[i], 0, 7)->Wait(); !s.ok()) return s;
    }
    for (size_t i = 0; i < t.size(); ++i) {
      const float* d = t[i].data<float>();
      if (d[0] != 100.0f * i || d[counts[i] - 1] != 100.0f * i + counts[i] - 1) {
        return absl::InternalError(absl::StrCat("message ", i, " holds another's data"));
      }
    }
    return absl::OkStatus();
  }));
}

// The segments are unlinked once every rank mapped them: none in /dev/shm
// while the world runs, nor after.
TEST(UcxChannel, LeavesNothingInDevShm) {
  ExpectOk(RunWorld(Options(kLimit), [](int r, Communicator& world) {
    Tensor t = Iota(4, 1);
    absl::Status s = world.AllReduce(t, ReduceOp::kSum)->Wait();
    if (s.ok() && !OurShmNames().empty()) {
      return absl::InternalError(absl::StrCat("in /dev/shm: ", OurShmNames()[0]));
    }
    return s;
  }));
  EXPECT_TRUE(OurShmNames().empty());
}

}  // namespace
}  // namespace loom::comm::ucx
