// The ucx backend under failure (issue #14), ranks as threads of this
// process (one UCP context each, over shared memory). Each test is its own
// bazel target (BUILD), named after the defect it guards against.
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/store/memory_store.h"
#include "comm/testing/conformance.h"
#include "comm/testing/ranks_as_threads.h"
#include "comm/ucx/communicator.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace loom::comm::ucx {
namespace {

using core::DType;
using core::Tensor;

// fn(rank, world) on `n` threads, each rank of one ucx world over `store`.
absl::Status RunUcx(int n, const UcxOptions& options,
                    const std::function<absl::Status(int, Communicator&)>& fn,
                    std::shared_ptr<Store> store = std::make_shared<MemoryStore>()) {
  return testing::RunThreads(n, [&](int r) -> absl::Status {
           auto world = Create(r, n, store, options);
           if (!world.ok()) return world.status();
           return fn(r, **world);
         })
      .first;
}

UcxOptions Short(absl::Duration timeout) {
  UcxOptions o;
  o.comm.timeout = timeout;
  o.connect_timeout = absl::Seconds(10);
  return o;
}

Tensor Full(int64_t n, float v) {
  Tensor t = *Tensor::Empty({n}, DType::kF32);
  std::fill(t.data<float>(), t.data<float>() + n, v);
  return t;
}

// Memory this test owns, lent to a communicator as a tensor. Once the
// communicator lets go of it (the last tensor on it goes) the test
// overwrites it, so a write by the transport after that shows.
class Probe {
 public:
  explicit Probe(size_t floats) : memory_(floats, 0) {}
  Tensor Lend() {
    auto storage = core::Storage::Borrow(memory_.data(), memory_.size() * sizeof(float),
                                         core::Device::CPU());
    lent_ = storage;
    return *Tensor::FromStorage(std::move(storage), 0, {static_cast<int64_t>(memory_.size())},
                                DType::kF32);
  }
  void OverwriteIfReleased() {
    if (!lent_.expired()) return;
    std::memset(memory_.data(), 0xAB, memory_.size() * sizeof(float));
    overwritten_ = true;
  }
  bool Intact() const {
    const auto* b = reinterpret_cast<const unsigned char*>(memory_.data());
    return !overwritten_ || std::all_of(b, b + memory_.size() * sizeof(float),
                                        [](unsigned char c) { return c == 0xAB; });
  }

 private:
  std::vector<float> memory_;
  std::weak_ptr<core::Storage> lent_;
  bool overwritten_ = false;
};

// Item 1: rank 0 destroys two children while a receive (Recv) and a
// collective step (AllGather, whose receive targets the output) are posted
// in them; rank 1 then sends their messages, late, and a sibling (the world)
// progresses the shared worker. Before the fix the transport returned
// Cancelled without cancelling, the engine freed the requests (heap, stack)
// and dropped the tensors, and the late messages landed in the memory the
// communicator had let go (the overwrite below changes).
TEST(UcxFailure, ShutdownCancelsPostedRequests) {
  absl::Status s = RunUcx(2, Short(absl::Seconds(2)), [](int r, Communicator& world) {
    auto p2p = world.Split(0, r, "p2p");
    if (!p2p.ok()) return p2p.status();
    auto coll = world.Split(0, r, "coll");
    if (!coll.ok()) return coll.status();
    auto sync = [&] { return world.BarrierWithin(absl::Seconds(30))->Wait(); };
    constexpr int64_t kN = 64;
    Probe inbox(kN), gathered(2 * kN);
    if (r == 0) {
      Tensor in = inbox.Lend(), out = gathered.Lend(), mine = Full(kN, 1);
      WorkPtr recv = (*p2p)->Recv(in, 1, 5);
      WorkPtr gather = (*coll)->AllGather(mine, out);
      (void)gather->Wait(absl::Milliseconds(300));  // both posted by now
      p2p->reset();
      coll->reset();
      if (recv->Wait(absl::Seconds(5)).ok() || gather->Wait(absl::Seconds(5)).ok()) {
        return absl::InternalError("an op of a destroyed communicator succeeded alone");
      }
      recv.reset();
      gather.reset();
      in = out = Tensor();
      inbox.OverwriteIfReleased();
      gathered.OverwriteIfReleased();
    }
    if (absl::Status s = sync(); !s.ok()) return s;
    if (r == 1) {
      Tensor late = Full(kN, 9), late_out = Full(2 * kN, 0);
      (void)(*p2p)->Send(late, 0, 5)->Wait(absl::Seconds(5));
      // Sends its block, then times out waiting for rank 0's.
      (void)(*coll)->AllGather(late, late_out)->Wait(absl::Seconds(10));
    }
    for (int k = 0; k < 3; ++k) {
      if (absl::Status s = sync(); !s.ok()) return s;
    }
    if (!inbox.Intact() || !gathered.Intact()) {
      return absl::InternalError(absl::StrCat(
          "a late message was written into memory let go after its communicator was destroyed "
          "(receive: ", inbox.Intact() ? "intact" : "written", ", all_gather output: ",
          gathered.Intact() ? "intact" : "written", ")"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Item 2: the conformance suite's failed-op case, with rendezvous for
// messages above 8 KiB (UCX_RNDV_THRESH): rank 0's timed-out 1 MiB send
// stays posted (UCX cannot cancel sends), so rank 1's late receive reads
// its buffer. Before the fix the engine let go of it at the timeout.
TEST(UcxFailure, FailedOpKeepsBuffers) {
  setenv("UCX_RNDV_THRESH", "8192", 1);
  for (int n : {2, 3}) {
    const absl::Duration timeout = absl::Seconds(2);
    absl::Status s = RunUcx(n, Short(timeout), [&](int, Communicator& world) {
      return testing::FailedOpKeepsBuffers(world, timeout);
    });
    EXPECT_TRUE(s.ok()) << "world of " << n << ": " << s;
  }
  unsetenv("UCX_RNDV_THRESH");
}

// Item 10c: a world re-created over the same store. Rank 1 comes late to
// the second one, so rank 0 looks up its address before rank 1 has
// published the new one. Before the fix the keys had no generation: rank 0
// read the first world's address (a destroyed worker) and could not reach
// rank 1.
TEST(UcxFailure, RecreatedWorldReadsFreshAddresses) {
  auto store = std::make_shared<MemoryStore>();
  for (int round = 0; round < 2; ++round) {
    absl::Status s = testing::RunThreads(2, [&](int r) -> absl::Status {
                       if (round == 1 && r == 1) absl::SleepFor(absl::Seconds(1));
                       auto world = Create(r, 2, store, Short(absl::Seconds(5)));
                       if (!world.ok()) return world.status();
                       Tensor t = Full(16, static_cast<float>(r + 1));
                       absl::Status s = (*world)->AllReduce(t, ReduceOp::kSum)->Wait();
                       if (!s.ok()) return s;
                       if (t.data<float>()[0] != 3) return absl::InternalError("wrong sum");
                       return absl::OkStatus();
                     }).first;
    EXPECT_TRUE(s.ok()) << "world #" << round << ": " << s;
  }
}

// Item 11: a broadcast root runs ahead of a rank that progresses its worker
// (waiting in a receive) but has not posted the broadcasts' receives yet:
// every eager message lands in that rank's unexpected queue. The root may
// get only UcxOptions::max_bytes_ahead (plus one message) ahead; before the
// fix all 48 MiB went out (unbounded unexpected memory at the receiver).
TEST(UcxFailure, EagerSendersStayBoundedAhead) {
  UcxOptions o = Short(absl::Seconds(30));
  constexpr int kOps = 48;
  constexpr int64_t kN = 256 << 10;  // floats: 1 MiB per broadcast
  const int64_t bound = static_cast<int64_t>(o.max_bytes_ahead / (kN * sizeof(float))) + 1;
  int ahead = -1;
  absl::Status s = RunUcx(2, o, [&](int r, Communicator& world) {
    auto side = world.Split(0, r, "side");
    if (!side.ok()) return side.status();
    Tensor go = Full(1, 0);
    std::vector<Tensor> data;
    for (int k = 0; k < kOps; ++k) data.push_back(Full(kN, r == 0 ? k : -1));
    std::vector<WorkPtr> works;
    if (r == 0) {
      for (int k = 0; k < kOps; ++k) works.push_back(world.Broadcast(data[k], 0));
      absl::SleepFor(absl::Milliseconds(1500));
      ahead = static_cast<int>(std::count_if(works.begin(), works.end(),
                                             [](const WorkPtr& w) { return w->Poll(); }));
      if (absl::Status s = (*side)->Send(go, 1, 0)->Wait(); !s.ok()) return s;
    } else {
      // Progresses the worker (takes in the root's messages) meanwhile.
      if (absl::Status s = (*side)->Recv(go, 0, 0)->Wait(); !s.ok()) return s;
      for (int k = 0; k < kOps; ++k) works.push_back(world.Broadcast(data[k], 0));
    }
    for (int k = 0; k < kOps; ++k) {
      if (absl::Status s = works[k]->Wait(); !s.ok()) return s;
      if (data[k].data<float>()[kN - 1] != k) return absl::InternalError("wrong broadcast data");
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LE(ahead, bound) << "the root finished " << ahead << " 1 MiB broadcasts before the "
                          << "other rank posted any receive (bound " << bound << ")";
}

}  // namespace
}  // namespace loom::comm::ucx
