// The nccl backend on this machine's GPUs: the conformance suite with one
// rank (thread) per GPU, bad input, init and op timeouts. Every test that
// needs a GPU skips (GTEST_SKIP, with the CUDA error) on a machine without.
#include "comm/nccl/communicator.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/nccl/device_memory.h"
#include "comm/nccl/host_mirror.h"
#include "comm/store/memory_store.h"
#include "comm/testing/conformance.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/cuda/runtime.h"
#include "gtest/gtest.h"

namespace loom::comm::nccl {
namespace {

using core::Device;
using core::DType;
using core::Tensor;

// Number of GPUs, or 0 with the reason in *why.
int Gpus(std::string* why) {
  absl::StatusOr<int> n = GpuCount();
  if (!n.ok()) {
    *why = std::string(n.status().message());
    return 0;
  }
  return *n;
}

#define SKIP_WITHOUT_GPU(n)                                                         \
  std::string why_no_gpu;                                                           \
  const int n = Gpus(&why_no_gpu);                                                  \
  if (n == 0) GTEST_SKIP() << "skipped: no GPU on this machine (" << why_no_gpu << ")"

// Runs body(rank, comm) on `n` threads, one GPU each, all in one NCCL world.
void RunWorld(int n, const NcclOptions& base,
              const std::function<absl::Status(int, Communicator&)>& body) {
  auto store = std::make_shared<MemoryStore>();
  testing::RankStatuses st = testing::RunThreads(n, [&](int r) -> absl::Status {
    NcclOptions o = base;
    o.local_rank = r;
    o.generation = 0;  // threads of one process: not a per-process count
    auto c = Create(r, n, store, o);
    if (!c.ok()) return c.status();
    return body(r, **c);
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st.each[r].ok()) << "rank " << r << ": " << st.each[r];
}

TEST(NcclBackend, LinkedVersionWorksWithoutAGpu) {
  EXPECT_TRUE(absl::StartsWith(LinkedNcclVersion(), "2.")) << LinkedNcclVersion();
}

TEST(NcclBackend, CreateWithoutAGpuIsUnavailable) {
  std::string why;
  if (Gpus(&why) > 0) GTEST_SKIP() << "skipped: this machine has a GPU";
  auto c = Create(0, 1, std::make_shared<MemoryStore>());
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "no usable GPU")) << c.status();
}

TEST(NcclBackend, CreateArgumentErrors) {
  EXPECT_TRUE(absl::IsInvalidArgument(Create(0, 1, nullptr).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Create(2, 2, std::make_shared<MemoryStore>()).status()));
}

TEST(NcclBackend, DeviceBeyondTheGpuCountIsRejected) {
  SKIP_WITHOUT_GPU(n);
  NcclOptions o;
  o.device = n;  // one past the last GPU
  auto c = Create(0, 1, std::make_shared<MemoryStore>(), o);
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "ranks per node")) << c.status();
}

// Without NcclOptions::device the local rank wraps around the visible GPUs
// (one GPU visible per task under Slurm: every rank uses its cuda:0).
TEST(NcclBackend, LocalRankWrapsAroundTheVisibleGpus) {
  SKIP_WITHOUT_GPU(n);
  NcclOptions o;
  o.local_rank = n;
  o.comm.group_name = "wrap";
  auto c = Create(0, 1, std::make_shared<MemoryStore>(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->device(), Device::CUDA(0));
}

// The whole suite, one rank per GPU (NCCL refuses two ranks on one GPU), on
// host tensors mirrored to each rank's GPU; one world for all cases.
TEST(NcclBackend, Conformance) {
  SKIP_WITHOUT_GPU(n);
  testing::SuiteOptions so;
  so.detects_mismatch = false;  // NCCL has no message signatures
  so.p2p_matches_tags = false;  // NCCL matches a pair's messages in issue order
  NcclOptions o;
  o.comm.timeout = absl::Seconds(60);
  RunWorld(n, o, [&](int rank, Communicator& device_comm) {
    // Borrowed: device_comm belongs to RunWorld.
    std::unique_ptr<Communicator> c =
        MirrorHostTensors(std::shared_ptr<Communicator>(&device_comm, [](Communicator*) {}));
    absl::Status first;
    for (const testing::Case& k : testing::Cases(so)) {
      absl::Time t0 = absl::Now();
      absl::Status s = k.body(*c);
      std::printf("[nccl rank %d/%d] %s %s (%s)%s%s\n", rank, n, s.ok() ? "[ OK ]" : "[FAIL]",
                  k.name.c_str(), absl::FormatDuration(absl::Now() - t0).c_str(),
                  s.ok() ? "" : ": ", s.ok() ? "" : s.ToString().c_str());
      if (first.ok() && !s.ok()) first = absl::Status(s.code(), k.name + ": " + std::string(s.message()));
    }
    c.reset();
    return first;
  });
}

// comm.h's contract: an argument error is reported before anything is sent,
// and the rejected op aborts the communicator (its peers' op with that
// sequence number can never complete); a new communicator works. (Seen on
// the H200, 2026-12-04: this test used to expect the aborted one to go on.)
TEST(NcclBackend, CpuTensorIsInvalidArgumentAndAbortsTheCommunicator) {
  SKIP_WITHOUT_GPU(n);
  (void)n;
  auto c = Create(0, 1, std::make_shared<MemoryStore>());
  ASSERT_TRUE(c.ok()) << c.status();
  Tensor host = *Tensor::Empty({8}, DType::kF32);
  Tensor dev = *EmptyOnDevice({8}, DType::kF32, (*c)->device());
  absl::Status s = (*c)->AllReduce(host, ReduceOp::kSum)->Wait();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "all_reduce")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "is on cpu")) << s;
  s = (*c)->AllGather(dev, host)->Wait();
  EXPECT_FALSE(s.ok());
  // Aborted: a correct op now fails, naming the first error.
  s = (*c)->AllReduce(dev, ReduceOp::kSum)->Wait();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "is on cpu")) << s;
  c->reset();
  auto fresh = Create(0, 1, std::make_shared<MemoryStore>());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  Tensor d2 = *EmptyOnDevice({8}, DType::kF32, (*fresh)->device());
  std::vector<float> ones(8, 1.0f), got(8, 0.0f);
  ASSERT_TRUE(CopyBytes(d2.raw_data(), ones.data(), 32, true, d2.device().index).ok());
  ASSERT_TRUE((*fresh)->AllReduce(d2, ReduceOp::kSum)->Wait().ok());
  ASSERT_TRUE(CopyBytes(got.data(), d2.raw_data(), 32, false, d2.device().index).ok());
  EXPECT_EQ(got, ones);
}

TEST(NcclBackend, SplitWithoutColorGivesNull) {
  SKIP_WITHOUT_GPU(n);
  (void)n;
  auto c = Create(0, 1, std::make_shared<MemoryStore>());
  ASSERT_TRUE(c.ok()) << c.status();
  auto none = (*c)->Split(-1, 0, "none");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  auto one = (*c)->Split(3, 0, "one");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_NE(*one, nullptr);
  EXPECT_EQ((*one)->size(), 1);
  EXPECT_EQ((*one)->group_name(), "one");
  EXPECT_TRUE((*one)->Barrier()->Wait().ok());
}

// Rank 1 of 2 never starts: rank 0's NCCL init is aborted at the timeout.
// (Possible on one GPU: only rank 0 touches it.)
TEST(NcclBackend, InitTimesOutWhenAPeerNeverJoins) {
  SKIP_WITHOUT_GPU(n);
  (void)n;
  NcclOptions o;
  o.comm.timeout = absl::Seconds(3);
  o.comm.group_name = "lonely";
  absl::Time t0 = absl::Now();
  auto c = Create(0, 2, std::make_shared<MemoryStore>(), o);
  absl::Duration took = absl::Now() - t0;
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "group 'lonely'")) << c.status();
  EXPECT_LT(took, absl::Seconds(30)) << "the abort took too long";
}

// Rank 1 of 2 waits for a unique id that rank 0 never publishes.
TEST(NcclBackend, NonRootTimesOutWaitingForTheUniqueId) {
  SKIP_WITHOUT_GPU(n);
  (void)n;
  NcclOptions o;
  o.comm.timeout = absl::Milliseconds(300);
  auto c = Create(1, 2, std::make_shared<MemoryStore>(), o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "unique id")) << c.status();
}

// The watchdog, on one GPU: the compute stream is held by a host function
// that blocks, so an all-reduce ordered after it cannot finish; at the
// communicator's timeout Wait returns DeadlineExceeded naming op, group and
// sequence number, the communicator is aborted and later ops fail fast.
// (A dead peer needs two GPUs: see conformance_main --mode=dead_peer.)
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void Open() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
  static void CUDART_CB Block(void* self) {
    auto* g = static_cast<Gate*>(self);
    std::unique_lock<std::mutex> l(g->mu);
    g->cv.wait(l, [g] { return g->open; });
  }
  // Makes `device` current and holds its compute stream until Open();
  // returns that stream (null after a failed assertion).
  cudaStream_t Hold(Device device) {
    EXPECT_TRUE(core::cuda::SetCurrentDevice(device.index).ok());
    cudaStream_t stream = *core::cuda::CurrentStream();
    EXPECT_EQ(cudaLaunchHostFunc(stream, &Gate::Block, this), cudaSuccess);
    return stream;
  }
};

// One rank on GPU 0, for the stream and watchdog tests.
std::unique_ptr<Communicator> OneRank(const std::string& group, absl::Duration timeout) {
  NcclOptions o;
  o.comm.timeout = timeout;
  o.comm.group_name = group;
  auto c = Create(0, 1, std::make_shared<MemoryStore>(), o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(NcclBackend, WatchdogAbortsAStalledOp) {
  SKIP_WITHOUT_GPU(n);
  (void)n;
  const absl::Duration timeout = absl::Seconds(2);
  std::unique_ptr<Communicator> c = OneRank("stall", timeout);
  ASSERT_NE(c, nullptr);
  Communicator& comm = *c;
  Tensor t = *EmptyOnDevice({1024}, DType::kF32, comm.device());
  ASSERT_TRUE(comm.AllReduce(t, ReduceOp::kSum)->Wait().ok());  // #0 works

  Gate gate;
  cudaStream_t compute = gate.Hold(comm.device());
  // ncclCommAbort may wait for the device, which waits for the gate: open it
  // a little after the timeout in any case.
  std::thread opener([&] {
    absl::SleepFor(timeout + absl::Seconds(2));
    gate.Open();
  });
  WorkPtr w = comm.AllReduce(t, ReduceOp::kSum);  // #1, stuck behind the gate
  absl::Status early = w->Wait(absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(early)) << early;
  EXPECT_TRUE(absl::StrContains(early.message(), "of waiting")) << early;
  EXPECT_FALSE(w->Poll()) << "a short Wait must not abort the op";

  absl::Time t0 = absl::Now();
  absl::Status s = w->Wait();
  absl::Duration took = absl::Now() - t0;
  gate.Open();
  opener.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  for (const char* part : {"all_reduce #1", "group 'stall'", "timed out", "aborted"}) {
    EXPECT_TRUE(absl::StrContains(s.message(), part)) << s << " lacks " << part;
  }
  EXPECT_LT(took, timeout + absl::Seconds(10));

  absl::Status again = comm.AllReduce(t, ReduceOp::kSum)->Wait(absl::Seconds(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  EXPECT_TRUE(absl::StrContains(again.message(), "aborted")) << again;
  EXPECT_TRUE(absl::IsFailedPrecondition(comm.Split(0, 0, "x").status()));
  EXPECT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
}

// WaitOnStream (the layers' hot-path wait): with the compute stream held by
// a gate the all-reduce cannot run, yet WaitOnStream returns at once; a copy
// queued after it on the compute stream still reads the reduced values, so
// the stream, not the host, waited.
TEST(NcclBackend, WaitOnStreamOrdersTheStreamWithoutBlockingTheHost) {
  SKIP_WITHOUT_GPU(n);
  (void)n;
  std::unique_ptr<Communicator> c = OneRank("stream", absl::Minutes(1));
  ASSERT_NE(c, nullptr);
  Communicator& comm = *c;
  const int64_t count = 1 << 20;
  Tensor host = *Tensor::Empty({count}, DType::kF32);
  for (int64_t i = 0; i < count; ++i) host.data<float>()[i] = static_cast<float>(i % 1000);
  Tensor poison = *Tensor::Empty({count}, DType::kF32);
  for (int64_t i = 0; i < count; ++i) poison.data<float>()[i] = NAN;
  Tensor in = *EmptyOnDevice({count}, DType::kF32, comm.device());
  Tensor out = *EmptyOnDevice({count}, DType::kF32, comm.device());
  Tensor copy = *EmptyOnDevice({count}, DType::kF32, comm.device());
  ASSERT_TRUE(CopyToDevice(host, in).ok());
  ASSERT_TRUE(CopyToDevice(poison, out).ok());
  ASSERT_TRUE(CopyToDevice(poison, copy).ok());

  Gate gate;
  cudaStream_t compute = gate.Hold(comm.device());
  WorkPtr w = comm.AllReduce(in, out, ReduceOp::kSum);
  absl::Time t0 = absl::Now();
  absl::Status s = w->WaitOnStream();
  absl::Duration took = absl::Now() - t0;
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_FALSE(w->Poll()) << "the op cannot have run: the compute stream is gated";
  EXPECT_LT(took, absl::Seconds(2)) << "WaitOnStream blocked the host";
  ASSERT_EQ(cudaMemcpyAsync(copy.raw_data(), out.raw_data(), copy.nbytes(),
                            cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);
  w.reset();  // the watchdog keeps the op (and its tensors) until it is done
  gate.Open();
  Tensor back = *Tensor::Empty({count}, DType::kF32);
  ASSERT_TRUE(CopyToHost(copy, back).ok());
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(back.data<float>()[i], host.data<float>()[i]) << "element " << i;
  }
}

// An op left to the stream that never completes is still timed out: the
// watchdog thread aborts the communicator, and the next op says why.
TEST(NcclBackend, WatchdogTimesOutAnOpLeftToTheStream) {
  SKIP_WITHOUT_GPU(n);
  (void)n;
  const absl::Duration timeout = absl::Seconds(2);
  std::unique_ptr<Communicator> c = OneRank("stream_stall", timeout);
  ASSERT_NE(c, nullptr);
  Communicator& comm = *c;
  Tensor t = *EmptyOnDevice({1024}, DType::kF32, comm.device());
  ASSERT_TRUE(comm.AllReduce(t, ReduceOp::kSum)->Wait().ok());  // #0

  Gate gate;
  cudaStream_t compute = gate.Hold(comm.device());
  std::thread opener([&] {
    absl::SleepFor(timeout + absl::Seconds(2));
    gate.Open();
  });
  EXPECT_TRUE(comm.AllReduce(t, ReduceOp::kSum)->WaitOnStream().ok());  // #1, handle dropped
  absl::SleepFor(timeout + absl::Seconds(3));
  opener.join();
  absl::Status next = comm.AllReduce(t, ReduceOp::kSum)->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(next)) << next;
  for (const char* part : {"aborted", "all_reduce #1", "timed out"}) {
    EXPECT_TRUE(absl::StrContains(next.message(), part)) << next << " lacks " << part;
  }
  EXPECT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
}

}  // namespace
}  // namespace loom::comm::nccl
