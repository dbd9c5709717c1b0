// The mpi backend under failure (issue #14): cases that leave the MPI world
// broken (a timed-out op, an aborted communicator), so each runs in its own
// mpirun (run_failure_case.sh) instead of in the conformance suite:
//   mpirun -np 2 failure_test_main <case>
// Every rank prints "[mpi rank r/n] <case> OK" or "... FAIL: <why>" and exits
// without MPI_Finalize (the world is broken on purpose). A case that hangs
// is reported by a watchdog after kHang.
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/comm.h"
#include "comm/mpi/communicator.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace loom::comm::mpi {
namespace {

using core::DType;
using core::Tensor;

// The op timeout of every communicator here, and how long a case may run.
constexpr absl::Duration kTimeout = absl::Seconds(2);
constexpr absl::Duration kHang = absl::Seconds(30);
// Syncs on a healthy communicator while the other rank is late on purpose.
constexpr absl::Duration kSync = absl::Seconds(30);

Tensor Full(int64_t n, float v) {
  Tensor t = *Tensor::Empty({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = v;
  return t;
}

bool AllEqual(const Tensor& t, float v) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.data<float>()[i] != v) return false;
  }
  return true;
}

// Failures of one rank's checks, joined; the rank still follows the case's
// protocol so the other rank does not hang.
struct Errors {
  std::string text;
  void Add(const std::string& e) { absl::StrAppend(&text, text.empty() ? "" : "; ", e); }
  absl::Status status() const {
    return text.empty() ? absl::OkStatus() : absl::InternalError(text);
  }
};

absl::Status Sync(Communicator& c, int times = 1) {
  for (int k = 0; k < times; ++k) {
    absl::Status s = c.BarrierWithin(kSync)->Wait();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Item 2: a failed op's buffers stay alive while MPI may still write into
// them. Rank 0 times out an out-of-place all-reduce and an in-place
// reduce-scatter (whose result MPI writes into staging memory) and drops the
// handles; rank 1 then joins both late, so MPI completes them on rank 0
// during later, unrelated MPI calls. Before the fix MpiWork kept no tensors
// and freed the staging with the handle: MPI wrote into freed memory (caught
// here by same-sized probe allocations that reuse it).
absl::Status FailedOpKeepsBuffers(Communicator& world) {
  const int r = world.rank();
  auto side = world.Split(0, r, "side");  // stays healthy: syncs and progress
  if (!side.ok()) return side.status();
  auto slow = world.Split(0, r, "slow");  // rank 1 is late here
  if (!slow.ok()) return slow.status();
  constexpr int64_t kN = 200;  // an 800-byte staging block (a malloc size class of its own)
  // Above MpiOptions::small_allreduce_bytes: MPI_Iallreduce, whose request
  // cannot be cancelled. (A small all-reduce's receives can be, and its
  // sends only read: MPI is done with its output once they are swept.)
  constexpr int64_t kAllReduceN = (128 << 10) / sizeof(float);
  Tensor ar_in = Full(kAllReduceN, 1), ar_out = Full(kAllReduceN, 0);
  Tensor rs = Full(2 * kN, 1);
  Tensor rs_out = *rs.View(r * kN, {kN});  // in place: output at input's slot `rank`
  Errors errors;
  if (r == 0) {
    WorkPtr a = (*slow)->AllReduce(ar_in, ar_out, ReduceOp::kSum);
    WorkPtr b = (*slow)->ReduceScatter(rs, rs_out, ReduceOp::kSum);
    absl::Status sa = a->Wait();
    if (!absl::IsDeadlineExceeded(sa)) {
      errors.Add(absl::StrCat("all_reduce with a late peer: expected DeadlineExceeded, got ",
                              sa.ToString()));
    }
    absl::Status sb = b->Wait();
    if (sb.ok()) errors.Add("reduce_scatter after an abort succeeded");
    a.reset();
    b.reset();
    // Memory freed by the dropped handles would be handed out again here.
    std::vector<std::vector<char>> probes;
    for (int k = 0; k < 16; ++k) probes.emplace_back(kN * sizeof(float), 0x5A);
    if (ar_out.storage().use_count() < 2) {
      errors.Add(
          "the timed-out all_reduce's output was released with its handle although its MPI "
          "request is still pending (MPI may still write into it)");
    }
    // The communicator is aborted: a later op fails at once, naming the timeout.
    absl::Time t0 = absl::Now();
    absl::Status later = (*slow)->AllReduce(ar_in, ReduceOp::kSum)->Wait(absl::Seconds(1));
    if (!absl::IsFailedPrecondition(later) || !absl::StrContains(later.message(), sa.message()) ||
        absl::Now() - t0 > absl::Milliseconds(500)) {
      errors.Add(absl::StrCat("op after a timeout: expected a prompt FailedPrecondition naming \"",
                              sa.message(), "\", got ", later.ToString()));
    }
    if (absl::Status s = Sync(**side); !s.ok()) return s;  // rank 1 joins now
    // Rank 1's ops need rank 0's pending requests: they progress in here.
    if (absl::Status s = Sync(**side, 20); !s.ok()) return s;
    for (size_t k = 0; k < probes.size(); ++k) {
      for (char ch : probes[k]) {
        if (ch != 0x5A) {
          errors.Add(absl::StrCat("probe ", k, " changed: MPI wrote a timed-out op's result "
                                  "into memory freed with its handle (the in-place "
                                  "reduce_scatter's staging)"));
          break;
        }
      }
    }
    // Once MPI is done with them the buffers are let go.
    if (ar_out.storage().use_count() != 1) {
      errors.Add(absl::StrCat("the all_reduce's output is still referenced (",
                              ar_out.storage().use_count(), ") after its request completed"));
    }
  } else {
    if (absl::Status s = Sync(**side); !s.ok()) return s;
    absl::Status sa = (*slow)->AllReduce(ar_in, ar_out, ReduceOp::kSum)->Wait();
    absl::Status sb = (*slow)->ReduceScatter(rs, rs_out, ReduceOp::kSum)->Wait();
    if (!sa.ok() || !sb.ok()) {
      errors.Add(absl::StrCat("the late rank's ops: ", sa.ToString(), "; ", sb.ToString()));
    }
    if (absl::Status s = Sync(**side, 20); !s.ok()) return s;
  }
  return errors.status();
}

// Item 3: a Split that a peer never joins returns DeadlineExceeded within
// the op timeout, and while it waits every other MPI wait of the process
// goes on. Before the fix MPI_Comm_split blocked forever holding the
// process-wide MPI lock: the Split never returned and an all-reduce on
// another communicator never got the lock (the watchdog reports a hang).
absl::Status SplitNeverBlocksUnderLock(Communicator& world) {
  const int r = world.rank();
  auto self = world.Split(r, 0, "self");  // each rank alone: needs no peer
  if (!self.ok()) return self.status();
  if (r != 0) {
    // Absent from the Split; stays alive (out of MPI) until rank 0 is done.
    absl::SleepFor(absl::Seconds(6));
    return absl::OkStatus();
  }
  std::atomic<bool> done{false};
  absl::Status split_status;
  absl::Duration split_took;
  std::thread splitter([&] {
    absl::Time t0 = absl::Now();
    auto child = world.Split(0, 0, "absent_peer");
    split_took = absl::Now() - t0;
    split_status = child.ok() ? absl::InternalError("Split succeeded without rank 1")
                              : child.status();
    done = true;
  });
  Tensor x = Full(16, 1);
  absl::Duration worst;
  absl::Status other;
  int ops = 0;
  const absl::Time start = absl::Now();
  while (!done && absl::Now() - start < kTimeout + absl::Seconds(8)) {
    absl::Time t0 = absl::Now();
    absl::Status s = (*self)->AllReduce(x, ReduceOp::kSum)->Wait(absl::Seconds(5));
    worst = std::max(worst, absl::Now() - t0);
    if (!s.ok() && other.ok()) other = s;
    ++ops;
  }
  if (!done) {
    splitter.detach();
    return absl::InternalError(absl::StrCat("Split without rank 1 did not return within ",
                                            absl::FormatDuration(absl::Now() - start)));
  }
  splitter.join();
  if (!absl::IsDeadlineExceeded(split_status) ||
      !absl::StrContains(split_status.message(), "split")) {
    return absl::InternalError(absl::StrCat("Split without rank 1: expected DeadlineExceeded "
                                            "naming the split, got ", split_status.ToString()));
  }
  if (split_took > kTimeout + absl::Seconds(3)) {
    return absl::InternalError(absl::StrCat("Split without rank 1 failed only after ",
                                            absl::FormatDuration(split_took), " (timeout ",
                                            absl::FormatDuration(kTimeout), ")"));
  }
  if (!other.ok()) {
    return absl::InternalError("all_reduce on another communicator: " + other.ToString());
  }
  if (worst > absl::Milliseconds(500)) {
    return absl::InternalError(absl::StrCat(
        "an all_reduce on another communicator waited ", absl::FormatDuration(worst),
        " while Split waited for its peer (", ops, " ops)"));
  }
  return absl::OkStatus();
}

// Item 5: a BatchSendRecv rejected for one leg posts none of its legs.
// Rank 0's batch receives 8 floats with tag 5 and sends a leg over MPI's int
// count. Before the fix the receive was posted before the send leg's size
// check failed, stayed posted, and took rank 1's next message with tag 5
// (every later message with that tag shifted by one, silently).
absl::Status BatchLeavesNoReceivePosted(Communicator& world) {
  const int r = world.rank();
  auto side = world.Split(0, r, "side");
  if (!side.ok()) return side.status();
  auto p2p = world.Split(0, r, "p2p");
  if (!p2p.ok()) return p2p.status();
  Tensor got = Full(8, -1);
  Errors errors;
  if (r == 0) {
    // A leg of INT_MAX + 1 bytes over 64 real ones: rejected before any access.
    static char small[64];
    const int64_t huge = static_cast<int64_t>(INT_MAX) + 1;
    Tensor big = *Tensor::FromStorage(
        core::Storage::Borrow(small, static_cast<size_t>(huge), core::Device::CPU()), 0, {huge},
        DType::kU8);
    absl::Status s = (*p2p)->BatchSendRecv({{P2POp::Kind::kRecv, got, 1, 5},
                                            {P2POp::Kind::kSend, big, 1, 6}})
                         ->Wait(absl::Seconds(5));
    if (!absl::IsInvalidArgument(s)) {
      errors.Add(absl::StrCat("a batch with a leg over INT_MAX elements: expected "
                              "InvalidArgument, got ", s.ToString()));
    }
  }
  if (absl::Status s = Sync(**side); !s.ok()) return s;
  if (r == 1) {
    absl::Status s = (*p2p)->Send(Full(8, 42), 0, 5)->Wait();
    if (!s.ok()) return s;
  }
  if (absl::Status s = Sync(**side, 10); !s.ok()) return s;  // progress on rank 0
  if (r == 0) {
    if (!AllEqual(got, -1)) {
      errors.Add("the rejected batch's receive was posted and took rank 1's next message with "
                 "tag 5");
    }
    // That message is for the next receive with tag 5, or the communicator is
    // aborted by the argument error and the receive fails at once.
    Tensor next = Full(8, -1);
    absl::Status s = (*p2p)->Recv(next, 1, 5)->Wait(absl::Seconds(5));
    if (s.ok() ? !AllEqual(next, 42) : !absl::IsFailedPrecondition(s)) {
      errors.Add(absl::StrCat("the receive after the rejected batch: ", s.ToString(),
                              s.ok() ? " (wrong data)" : ""));
    }
  }
  return errors.status();
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: failure_test_main <case>\n");
    return 2;
  }
  const std::string name = argv[1];
  const std::pair<const char*, absl::Status (*)(Communicator&)> cases[] = {
      {"FailedOpKeepsBuffers", FailedOpKeepsBuffers},
      {"SplitNeverBlocksUnderLock", SplitNeverBlocksUnderLock},
      {"BatchLeavesNoReceivePosted", BatchLeavesNoReceivePosted},
  };
  absl::Status (*body)(Communicator&) = nullptr;
  for (const auto& c : cases) {
    if (name == c.first) body = c.second;
  }
  if (body == nullptr) {
    std::fprintf(stderr, "unknown case '%s'\n", name.c_str());
    return 2;
  }
  MpiOptions o;
  o.comm.timeout = kTimeout;
  auto world = CreateWorld(o);
  if (!world.ok()) {
    std::fprintf(stderr, "cannot create the mpi world: %s\n", world.status().ToString().c_str());
    return 2;
  }
  const std::string who =
      absl::StrCat("[mpi rank ", (*world)->rank(), "/", (*world)->size(), "] ");
  std::thread([who, name] {
    absl::SleepFor(kHang);
    std::printf("%s%s FAIL: hung for %s\n", who.c_str(), name.c_str(),
                absl::FormatDuration(kHang).c_str());
    std::fflush(nullptr);
    _exit(1);
  }).detach();
  absl::Status s = body(**world);
  std::printf("%s%s %s\n", who.c_str(), name.c_str(),
              s.ok() ? "OK" : ("FAIL: " + s.ToString()).c_str());
  std::fflush(nullptr);
  _exit(s.ok() ? 0 : 1);  // the world is broken on purpose: no MPI_Finalize
}

}  // namespace
}  // namespace loom::comm::mpi

int main(int argc, char** argv) { return loom::comm::mpi::Main(argc, argv); }
