// The staged communicator on the fake device (device memory behind poisoned
// pointers: a host access crashes): every op on device tensors gives, bit for
// bit, what the wrapped host communicator gives on host copies of them.

#include "comm/testing/host_staged_communicator.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/ops/ops.h"
#include "core/ops/testing/fake_device.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace loom::comm::testing {
namespace {

using core::Device;
using core::DType;
using core::Tensor;
using core::ops::testing::ScopedFakeDevice;

constexpr int kWorld = 4;
const Device kGpu = Device::CUDA(0);

// n f32 values that differ by rank and by `salt`, not exactly summable.
Tensor Values(int64_t n, int rank, int salt) {
  Tensor t = *Tensor::Empty({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) {
    t.data<float>()[i] = 0.1f * static_cast<float>((i * 7 + rank * 13 + salt * 31) % 97) - 3.3f;
  }
  return t;
}

absl::Status Same(const std::string& what, const Tensor& want, const Tensor& device) {
  if (device.device() != kGpu) return absl::InternalError(what + ": output left the device");
  LOOM_ASSIGN_OR_RETURN(Tensor got, device.To(Device::CPU()));
  if (got.nbytes() != want.nbytes() ||
      std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()) != 0) {
    return absl::InternalError(what + ": the device result differs from the host's");
  }
  return absl::OkStatus();
}

Tensor OnGpu(const Tensor& host) { return *host.To(kGpu); }

// Each collective on host tensors (the reference) and then on device copies
// through the staged communicator, over the same host communicator.
absl::Status Collectives(int rank, Communicator* host) {
  HostStagedCommunicator gpu(host, kGpu);
  if (gpu.device() != kGpu || gpu.rank() != rank || gpu.size() != kWorld) {
    return absl::InternalError("the staged communicator misreports itself");
  }
  const int64_t n = 1000;  // more than the local backend's small-message path in total
  {
    const Tensor in = Values(n, rank, 1);
    Tensor want = *Tensor::Empty({n}, DType::kF32);
    LOOM_RETURN_IF_ERROR(host->AllReduce(in, want, ReduceOp::kSum)->Wait());
    Tensor out = OnGpu(Values(n, 0, 0));
    LOOM_RETURN_IF_ERROR(gpu.AllReduce(OnGpu(in), out, ReduceOp::kSum)->Wait());
    LOOM_RETURN_IF_ERROR(Same("all_reduce", want, out));
    Tensor inout = OnGpu(in);  // in place, averaged
    LOOM_RETURN_IF_ERROR(host->AllReduce(in, want, ReduceOp::kAvg)->Wait());
    LOOM_RETURN_IF_ERROR(gpu.AllReduce(inout, ReduceOp::kAvg)->WaitOnStream());
    LOOM_RETURN_IF_ERROR(Same("all_reduce in place", want, inout));
  }
  {
    const Tensor in = Values(kWorld * n, rank, 2);
    Tensor want = *Tensor::Empty({n}, DType::kF32);
    LOOM_RETURN_IF_ERROR(host->ReduceScatter(in, want, ReduceOp::kSum)->Wait());
    Tensor out = OnGpu(Values(n, 0, 0));
    LOOM_RETURN_IF_ERROR(gpu.ReduceScatter(OnGpu(in), out, ReduceOp::kSum)->Wait());
    LOOM_RETURN_IF_ERROR(Same("reduce_scatter", want, out));
    Tensor whole = OnGpu(in);  // in place: the output is the input's slot `rank`
    Tensor slot = *whole.View(rank * n, {n});
    LOOM_RETURN_IF_ERROR(gpu.ReduceScatter(whole, slot, ReduceOp::kSum)->Wait());
    LOOM_RETURN_IF_ERROR(Same("reduce_scatter in place", want, slot));
  }
  {
    const Tensor in = Values(n, rank, 3);
    Tensor want = *Tensor::Empty({kWorld * n}, DType::kF32);
    LOOM_RETURN_IF_ERROR(host->AllGather(in, want)->Wait());
    Tensor out = OnGpu(Values(kWorld * n, 0, 0));
    LOOM_RETURN_IF_ERROR(gpu.AllGather(OnGpu(in), out)->Wait());
    LOOM_RETURN_IF_ERROR(Same("all_gather", want, out));
    Tensor whole = OnGpu(Values(kWorld * n, 0, 0));  // in place: the input at slot `rank`
    Tensor slot = *whole.View(rank * n, {n});
    LOOM_RETURN_IF_ERROR(core::ops::Copy(OnGpu(in), &slot));
    LOOM_RETURN_IF_ERROR(gpu.AllGather(slot, whole)->Wait());
    LOOM_RETURN_IF_ERROR(Same("all_gather in place", want, whole));
  }
  {
    const Tensor in = Values(n, rank, 4);
    Tensor want = *Tensor::Empty({n}, DType::kF32);
    LOOM_RETURN_IF_ERROR(host->Broadcast(in, want, 2)->Wait());
    Tensor out = OnGpu(Values(n, 0, 0));
    LOOM_RETURN_IF_ERROR(gpu.Broadcast(OnGpu(in), out, 2)->Wait());
    LOOM_RETURN_IF_ERROR(Same("broadcast", want, out));
  }
  {
    // Only root's output is written: elsewhere the device output keeps its contents.
    const Tensor in = Values(n, rank, 5);
    Tensor want = Values(n, rank, 6);
    LOOM_RETURN_IF_ERROR(host->Reduce(in, want, ReduceOp::kMax, 1)->Wait());
    Tensor out = OnGpu(Values(n, rank, 6));
    LOOM_RETURN_IF_ERROR(gpu.Reduce(OnGpu(in), out, ReduceOp::kMax, 1)->Wait());
    LOOM_RETURN_IF_ERROR(Same("reduce", want, out));
  }
  {
    const Tensor in = Values(kWorld * n, rank, 7);
    Tensor want = *Tensor::Empty({kWorld * n}, DType::kF32);
    LOOM_RETURN_IF_ERROR(host->AllToAll(in, want)->Wait());
    Tensor out = OnGpu(Values(kWorld * n, 0, 0));
    LOOM_RETURN_IF_ERROR(gpu.AllToAll(OnGpu(in), out)->Wait());
    LOOM_RETURN_IF_ERROR(Same("all_to_all", want, out));
  }
  {
    // Rank r sends (r + j) % 3 elements to rank j (some none): symmetric counts.
    std::vector<int64_t> counts(kWorld);
    int64_t total = 0;
    for (int j = 0; j < kWorld; ++j) total += counts[j] = (rank + j) % 3;
    const Tensor in = Values(total, rank, 8);
    Tensor want = *Tensor::Empty({total}, DType::kF32);
    LOOM_RETURN_IF_ERROR(host->AllToAllV(in, counts, want, counts)->Wait());
    Tensor out = OnGpu(Values(total, 0, 0));
    LOOM_RETURN_IF_ERROR(gpu.AllToAllV(OnGpu(in), counts, out, counts)->Wait());
    LOOM_RETURN_IF_ERROR(Same("all_to_all_v", want, out));
  }
  return gpu.Barrier()->Wait();
}

// A chain as the pipeline runs one: every rank posts its receive from the
// previous rank before its send to the next, leaves both in flight and waits
// later (a posted receive holds back its rank's later ops until it
// completes); then both directions of a ring in one batch.
absl::Status PointToPoint(int rank, Communicator* host) {
  HostStagedCommunicator gpu(host, kGpu);
  const int next = (rank + 1) % kWorld, prev = (rank + kWorld - 1) % kWorld;
  const bool first = rank == 0, last = rank == kWorld - 1;
  const int64_t n = 300;
  const Tensor mine = Values(n, rank, 9);
  Tensor want = *Tensor::Empty({n}, DType::kF32);
  std::vector<WorkPtr> host_works;
  if (!first) host_works.push_back(host->Recv(want, prev, 5));
  if (!last) host_works.push_back(host->Send(mine, next, 5));
  LOOM_RETURN_IF_ERROR(WaitAll(host_works));

  Tensor got = OnGpu(Values(n, 0, 0));
  WorkPtr r = first ? nullptr : gpu.Recv(got, prev, 5);
  WorkPtr s = last ? nullptr : gpu.Send(OnGpu(mine), next, 5);
  if (s != nullptr) LOOM_RETURN_IF_ERROR(s->Wait());
  if (r != nullptr) {
    LOOM_RETURN_IF_ERROR(r->Wait());
    LOOM_RETURN_IF_ERROR(Same("recv", want, got));
  }

  Tensor from_next = *Tensor::Empty({n}, DType::kF32), from_prev = from_next.Clone().value();
  LOOM_RETURN_IF_ERROR(host->BatchSendRecv({{P2POp::Kind::kRecv, from_prev, prev, 1},
                                            {P2POp::Kind::kRecv, from_next, next, 2},
                                            {P2POp::Kind::kSend, mine, next, 1},
                                            {P2POp::Kind::kSend, mine, prev, 2}})
                           ->Wait());
  Tensor d_next = OnGpu(Values(n, 0, 0)), d_prev = OnGpu(Values(n, 0, 0));
  const Tensor d_mine = OnGpu(mine);
  WorkPtr batch = gpu.BatchSendRecv({{P2POp::Kind::kRecv, d_prev, prev, 1},
                                     {P2POp::Kind::kRecv, d_next, next, 2},
                                     {P2POp::Kind::kSend, d_mine, next, 1},
                                     {P2POp::Kind::kSend, d_mine, prev, 2}});
  while (!batch->Poll()) {
  }
  // A Poll that finds the op done lands its outputs: a later Wait adds nothing.
  LOOM_RETURN_IF_ERROR(Same("batch recv from prev", from_prev, d_prev));
  LOOM_RETURN_IF_ERROR(Same("batch recv from next", from_next, d_next));
  return batch->Wait();
}

// Split's children stage too: an all-reduce over each half of the world.
absl::Status SplitChild(int rank, Communicator* host) {
  HostStagedCommunicator gpu(host, kGpu);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> half_host, host->Split(rank % 2, rank, "h"));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> half, gpu.Split(rank % 2, rank, "half"));
  if (half == nullptr || half->device() != kGpu || half->size() != kWorld / 2 ||
      half->rank() != rank / 2 || half->group_name() != "half") {
    return absl::InternalError("the split child misreports itself");
  }
  const Tensor in = Values(100, rank, 10);
  Tensor want = *Tensor::Empty({100}, DType::kF32);
  LOOM_RETURN_IF_ERROR(half_host->AllReduce(in, want, ReduceOp::kSum)->Wait());
  Tensor out = OnGpu(in);
  LOOM_RETURN_IF_ERROR(half->AllReduce(out, ReduceOp::kSum)->Wait());
  LOOM_RETURN_IF_ERROR(Same("split all_reduce", want, out));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> none, gpu.Split(-1, rank, "none"));
  if (none != nullptr) return absl::InternalError("color -1 joined a group");
  return absl::OkStatus();
}

TEST(HostStagedCommunicatorTest, CollectivesOnDeviceTensorsGiveTheHostResult) {
  ScopedFakeDevice device;
  const long copied = ScopedFakeDevice::copied_bytes();
  absl::Status s = RunRanksAsThreads(kWorld, Collectives);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_GT(ScopedFakeDevice::copied_bytes(), copied + kWorld * 4000 * 4)
      << "the device tensors must have moved through the fake device's copies";
}

TEST(HostStagedCommunicatorTest, PointToPointKeepsItsAsynchronousOrder) {
  ScopedFakeDevice device;
  absl::Status s = RunRanksAsThreads(kWorld, PointToPoint);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(HostStagedCommunicatorTest, SplitWrapsTheChild) {
  ScopedFakeDevice device;
  absl::Status s = RunRanksAsThreads(kWorld, SplitChild);
  EXPECT_TRUE(s.ok()) << s;
}

// Until an op completes its device outputs hold NaN: a read before the
// wait (a race on a GPU) cannot pass by luck.
TEST(HostStagedCommunicatorTest, OutputsReadBeforeTheWaitAreNaN) {
  ScopedFakeDevice device;
  absl::Status s = RunRanksAsThreads(2, [](int rank, Communicator* host) -> absl::Status {
    HostStagedCommunicator gpu(host, kGpu);
    const Tensor sent = Values(64, 0, 11);
    if (rank == 0) return gpu.Send(OnGpu(sent), 1, 0)->Wait();
    Tensor got = OnGpu(Values(64, 1, 12));
    WorkPtr recv = gpu.Recv(got, 0, 0);
    LOOM_ASSIGN_OR_RETURN(Tensor early, got.To(Device::CPU()));
    for (int64_t i = 0; i < early.numel(); ++i) {
      if (!std::isnan(early.data<float>()[i])) {
        return absl::InternalError("an output read before the wait is not NaN");
      }
    }
    LOOM_RETURN_IF_ERROR(recv->Wait());
    return Same("recv after the wait", sent, got);
  });
  EXPECT_TRUE(s.ok()) << s;
}

// An input changed while its op is in flight (NCCL's stream may read it any
// time until the op completes) fails the op's wait.
TEST(HostStagedCommunicatorTest, InputChangedInFlightFailsTheWait) {
  ScopedFakeDevice device;
  absl::Status s = RunRanksAsThreads(2, [](int rank, Communicator* host) -> absl::Status {
    HostStagedCommunicator gpu(host, kGpu);
    Tensor in = OnGpu(Values(64, rank, 13)), out = OnGpu(Values(64, 0, 0));
    WorkPtr w = gpu.AllReduce(in, out, ReduceOp::kSum);
    LOOM_RETURN_IF_ERROR(core::ops::Zero(&in));  // e.g. a pool buffer reused too early
    absl::Status waited = w->Wait();
    if (!absl::IsFailedPrecondition(waited) ||
        waited.message().find("was changed before the op completed") == std::string::npos) {
      return absl::InternalError(absl::StrCat("a changed input went unnoticed: ", waited.ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A host tensor handed to a device communicator is NCCL's argument error,
// found before anything moves, and aborts the communicator.
TEST(HostStagedCommunicatorTest, HostTensorsAreRefusedAndAbort) {
  ScopedFakeDevice device;
  absl::Status s = RunRanksAsThreads(2, [](int, Communicator* host) -> absl::Status {
    HostStagedCommunicator gpu(host, kGpu);
    const Tensor t = Values(8, 0, 0);
    absl::Status refused = gpu.AllReduce(t, ReduceOp::kSum)->Wait();
    if (!absl::IsInvalidArgument(refused) ||
        refused.message().find("is on cpu; this communicator moves memory of its device "
                               "(cuda:0)") == std::string::npos) {
      return absl::InternalError(absl::StrCat("a host tensor was not refused: ", refused.ToString()));
    }
    absl::Status after = gpu.AllReduce(OnGpu(t), ReduceOp::kSum)->Wait();
    if (!absl::IsFailedPrecondition(after) ||
        after.message().find(refused.message()) == std::string::npos) {
      return absl::InternalError(absl::StrCat("no abort after the refusal: ", after.ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace loom::comm::testing
