#include "comm/nccl/communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "comm/flight/recorder.h"
#include "comm/internal/algorithms.h"
#include "comm/internal/checks.h"
#include "comm/nccl/settle.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/dtype.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl backend needs NCCL >= 2.18 (ncclCommSplit, non-blocking communicators)"
#endif

namespace loom::comm::nccl {
namespace {

using core::DType;
using core::Tensor;
using internal::CheckAllGather;
using internal::CheckAllReduce;
using internal::CheckAllToAll;
using internal::CheckAllToAllV;
using internal::CheckBatch;
using internal::CheckBroadcast;
using internal::CheckP2P;
using internal::CheckReduce;
using internal::CheckReduceScatter;

std::string NcclText(ncclResult_t r) {
  std::string s = absl::StrCat(ncclGetErrorString(r), " (ncclResult_t ", static_cast<int>(r), ")");
  const char* last = ncclGetLastError(nullptr);  // the comm argument is unused
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&s, ": ", last);
  return s;
}

// An NCCL failure as a Status: remote/system errors (a peer died, the network
// failed) are Unavailable, argument errors InvalidArgument, the rest Internal.
absl::Status NcclStatus(ncclResult_t r, const std::string& context) {
  std::string msg = absl::StrCat(context, ": NCCL error: ", NcclText(r));
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError: return absl::UnavailableError(msg);
    case ncclInvalidArgument:
    case ncclInvalidUsage: return absl::InvalidArgumentError(msg);
    default: return absl::InternalError(msg);
  }
}

ncclDataType_t TypeOf(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t OpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProd: return ncclProd;
  }
  return ncclSum;
}

// Makes `device` the calling thread's device (CUDA's and core::cuda's view)
// for the scope, so core::cuda::CurrentStream() is this thread's compute
// stream *for that device*; restores both on exit.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    prev_core_ = core::cuda::CurrentDevice();
    if (cudaGetDevice(&prev_raw_) != cudaSuccess) prev_raw_ = -1;
    if (prev_core_ != device) {
      status_ = core::cuda::SetCurrentDevice(device);
    } else if (prev_raw_ != device) {
      status_ = core::cuda::CudaStatus(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__);
    }
  }
  ~DeviceScope() {
    if (prev_core_ != device_) core::cuda::SetCurrentDevice(prev_core_).IgnoreError();
    if (prev_raw_ >= 0 && prev_raw_ != device_) cudaSetDevice(prev_raw_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int device_;
  int prev_core_ = 0;
  int prev_raw_ = -1;
  absl::Status status_;
};

// A non-blocking communicator answers ncclInProgress while NCCL works in the
// background (init, split, lazy connection set-up of a first op). Waits until
// it settles; returns its state, or ncclInProgress if `deadline` passed.
// For a communicator nobody else uses yet, or any more (init, destruction);
// one in use waits with SettleLocked.
ncclResult_t Settle(ncclComm_t comm, ncclResult_t r, absl::Time deadline) {
  if (r != ncclInProgress || comm == nullptr) return r;
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) return q;
    if (state != ncclInProgress) return state;
    if (absl::Now() >= deadline) return ncclInProgress;
    if (spins < 100) {
      sched_yield();
    } else {
      absl::SleepFor(absl::Microseconds(200));
    }
  }
}

ncclConfig_t NonBlockingConfig(const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name.c_str();
  return config;
}

// Per group name: how many communicators of that name this process created
// (the store key generation when NcclOptions::generation is -1).
int64_t NextGeneration(const std::string& group) {
  static std::mutex mu;
  static std::map<std::string, int64_t>* counts = new std::map<std::string, int64_t>();
  std::lock_guard<std::mutex> l(mu);
  return (*counts)[group]++;
}

class NcclWork;

struct CommState {
  ncclComm_t comm = nullptr;  // null once aborted
  int device = 0;
  int rank = 0;
  int size = 1;
  std::string name;
  absl::Duration timeout;
  cudaStream_t stream = nullptr;  // the NCCL stream
  cudaEvent_t ready = nullptr;    // recorded on the compute stream before each op
  float* barrier_buf = nullptr;   // one float on the device (Barrier)

  std::mutex mu;  // everything below, and every NCCL call on `comm`
  // Ops are numbered in two sequences for their descriptions: collectives
  // (the same number on every rank) and point-to-point ops (ranks issue
  // different numbers of them). `issued` counts both: the watchdog's order.
  uint64_t seq = 0;
  uint64_t p2p_seq = 0;
  uint64_t issued = 0;
  absl::Status aborted;              // non-OK once the communicator is aborted
  std::vector<cudaEvent_t> events;   // free completion events
  // Ops left to the stream (Work::WaitOnStream) and not yet complete: the
  // watchdog thread polls them, so a stalled one still times out and aborts
  // the communicator, and their tensors live until the GPU is done.
  std::map<uint64_t, std::shared_ptr<NcclWork>> watched;  // in issue order
  std::condition_variable watchdog_cv;
  std::thread watchdog;  // started by the first WaitOnStream
  bool watchdog_stop = false;
  // The flight recorder (comm/flight/recorder.h; set once the NCCL
  // communicator exists): an op is recorded when issued, started once
  // enqueued on the stream, completed when a poll (Wait, Poll, the watchdog)
  // finds it done or failed; the first abort dumps. A Split child's members
  // are not known in world ranks (NCCL does not tell): its dumps list none.
  std::shared_ptr<flight::Recorder> recorder;
  int world_rank = 0;
  std::string flight_dir;
  int flight_entries = 2048;

  void StartRecorder() {
    flight::CommInfo fi;
    fi.group = name;
    fi.backend = "nccl";
    fi.world_rank = world_rank;
    fi.group_rank = rank;
    fi.group_size = size;
    fi.entries = flight_entries;
    fi.dir = flight_dir;
    recorder = flight::Recorder::Create(std::move(fi));
  }

  std::string Who() const {
    return absl::StrCat("group '", name, "' (nccl backend, rank ", rank, " of ", size, ", cuda:",
                        device, ")");
  }

  absl::StatusOr<cudaEvent_t> TakeEvent() {  // mu held, device current
    if (!events.empty()) {
      cudaEvent_t e = events.back();
      events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    LOOM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void GiveEvent(cudaEvent_t e) {
    std::lock_guard<std::mutex> l(mu);
    events.push_back(e);
  }

  // Aborts the NCCL communicator (mu held): in-flight NCCL kernels stop,
  // every later operation fails with FailedPrecondition naming `why`.
  void AbortLocked(const absl::Status& why) {
    if (!aborted.ok()) return;
    aborted = why;
    if (comm != nullptr) {
      DeviceScope ds(device);
      ncclCommAbort(comm);
      comm = nullptr;
    }
    if (recorder) recorder->FailureDump(why);
  }

  // Creates the stream, the events and the barrier buffer (device current).
  absl::Status Init() {
    int least = 0, greatest = 0;
    LOOM_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    // Communication ahead of compute when both are ready (as in Megatron).
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    LOOM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    LOOM_CUDA_RETURN_IF_ERROR(
        cudaMallocAsync(reinterpret_cast<void**>(&barrier_buf), sizeof(float), stream));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(barrier_buf, 0, sizeof(float), stream));
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }

  ~CommState() {
    DeviceScope ds(device);
    if (comm != nullptr && aborted.ok()) {
      // Finalize flushes queued operations (bounded: a dead peer must not hang
      // the destructor, and a process holds several communicators, each
      // finalized in turn), then destroy; abort if that does not complete.
      absl::Time deadline = absl::Now() + std::min(timeout, absl::Seconds(30));
      ncclResult_t r = Settle(comm, ncclCommFinalize(comm), deadline);
      if (r == ncclSuccess) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
      comm = nullptr;
    }
    if (barrier_buf != nullptr) cudaFreeAsync(barrier_buf, stream);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (ready != nullptr) cudaEventDestroy(ready);
    if (stream != nullptr) cudaStreamDestroy(stream);  // released once its work is done
  }
};

// Settle for a communicator in use, with st->mu held through `lock`: the
// lock is released between polls (WaitUntilSettled), so the watchdog keeps
// its period while an op or a split waits for NCCL (up to the op timeout),
// and can time out earlier ops and abort meanwhile. NCCL allows only
// ncclCommGetAsyncError and ncclCommAbort on a busy communicator, and those
// are all the watchdog calls on it. `comm` is st->comm or a child being
// split from it. Returns its state, or ncclInProgress at the deadline or
// once `st` was aborted meanwhile (then `comm`, if st's, is gone): callers
// check st->aborted first.
ncclResult_t SettleLocked(std::unique_lock<std::mutex>& lock, CommState* st, ncclComm_t comm,
                          ncclResult_t r, absl::Time deadline) {
  if (r != ncclInProgress || comm == nullptr) return r;
  ncclResult_t state = ncclInProgress;
  WaitUntilSettled(lock, deadline, [&] {
    if (!st->aborted.ok()) {
      state = ncclInProgress;
      return true;
    }
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) state = q;
    return state != ncclInProgress;
  });
  return state;
}

void StartWatchdogLocked(const std::shared_ptr<CommState>& st);

class NcclWork : public Work, public std::enable_shared_from_this<NcclWork> {
 public:
  // `timeout`: the op's own limit (zero: the communicator's), counted from
  // when it is issued (see communicator.h).
  // `order`: the op's place in the communicator's issue order.
  NcclWork(std::shared_ptr<CommState> st, std::string desc, uint64_t order, uint64_t flight_id,
           absl::Duration timeout = absl::ZeroDuration())
      : st_(std::move(st)),
        flight_id_(flight_id),
        desc_(std::move(desc)),
        order_(order),
        timeout_(timeout > absl::ZeroDuration() ? timeout : st_->timeout),
        deadline_(absl::Now() + timeout_) {}
  ~NcclWork() override {
    if (done_event_ != nullptr) st_->GiveEvent(done_event_);
  }

  // Set while issuing (mu held); `recorded_` once the done event is queued
  // after the op's kernels.
  cudaEvent_t done_event_ = nullptr;
  bool recorded_ = false;
  uint64_t order() const { return order_; }
  std::vector<Tensor> keep;  // the op's tensors, alive until it is done

  void FailNow(absl::Status s) {
    if (!done_) st_->recorder->Complete(flight_id_, false);
    done_ = true;
    status_ = std::move(s);
    keep.clear();
  }
  void Started() { st_->recorder->Start(flight_id_); }
  absl::Time deadline() const { return deadline_; }

  bool Poll() override {
    std::lock_guard<std::mutex> l(st_->mu);
    return PollLocked();
  }

  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time until = absl::Now() + timeout;
    for (int spins = 0;; ++spins) {
      {
        std::lock_guard<std::mutex> l(st_->mu);
        if (PollLocked()) break;
      }
      if (absl::Now() >= until) {
        return absl::DeadlineExceededError(absl::StrCat(
            desc_, " did not finish within ", absl::FormatDuration(timeout),
            " of waiting (the operation's own limit is ", absl::FormatDuration(timeout_), ")"));
      }
      if (spins < 64) continue;
      if (spins < 2000) {
        sched_yield();
      } else {
        absl::SleepFor(absl::Microseconds(50));
      }
    }
    return Finished();
  }

  absl::Status Wait() override {
    return Wait(timeout_ + std::max(absl::Seconds(5), timeout_ / 10));
  }

  absl::Status WaitOnStream() override {
    {
      std::lock_guard<std::mutex> l(st_->mu);
      if (!PollLocked()) {
        if (!watched_ && !st_->watchdog_stop) {
          StartWatchdogLocked(st_);
          st_->watched.emplace(order_, shared_from_this());
          watched_ = true;
        }
      } else if (!status_.ok()) {
        return Finished();
      }
    }
    return OrderComputeStream();
  }

  std::string Describe() const override { return desc_; }

  // The watchdog's check (mu held): true once the op is finished.
  bool PollForWatchdogLocked() { return PollLocked(); }

 private:
  // A finished op's status for its caller. Even a failed op orders the
  // compute stream after it when its kernels were queued: its tensors are
  // released, and the allocator may hand their memory to the compute stream
  // while an aborted NCCL kernel is still winding down.
  absl::Status Finished() {
    if (recorded_) {
      absl::Status ordered = OrderComputeStream();
      if (status_.ok()) return ordered;
    }
    return status_;
  }

  // Later work on the caller's compute stream sees the op's results (once).
  absl::Status OrderComputeStream() {
    if (ordered_) return absl::OkStatus();
    DeviceScope ds(st_->device);
    if (!ds.status().ok()) return ds.status();
    absl::StatusOr<cudaStream_t> compute = core::cuda::CurrentStream();
    if (!compute.ok()) return compute.status();
    cudaError_t e = cudaStreamWaitEvent(*compute, done_event_, 0);
    if (e != cudaSuccess) {
      return core::cuda::CudaStatus(e, "cudaStreamWaitEvent(compute stream, op done)", __FILE__,
                                    __LINE__);
    }
    ordered_ = true;
    return absl::OkStatus();
  }

  void FailAndAbort(absl::Status s) {
    FailNow(std::move(s));
    st_->AbortLocked(status_);
  }

  // An asynchronous NCCL error (a peer's failure, a network error): abort.
  bool CheckAsyncLocked() {
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(st_->comm, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess || state == ncclInProgress) return false;
    FailAndAbort(NcclStatus(state, absl::StrCat(desc_, " failed asynchronously; the communicator "
                                                       "is now aborted")));
    return true;
  }

  bool PollLocked() {
    if (done_) return true;
    if (!st_->aborted.ok()) {
      FailNow(absl::FailedPreconditionError(absl::StrCat(
          desc_, ": the communicator was aborted by an earlier error: ", st_->aborted.message())));
      return true;
    }
    const cudaError_t e = cudaEventQuery(done_event_);
    if (e == cudaSuccess) {
      // NCCL kernels also return early on an error: check before trusting the data.
      if (CheckAsyncLocked()) return true;
      st_->recorder->Complete(flight_id_, true);
      done_ = true;
      keep.clear();
      return true;
    }
    if (e != cudaErrorNotReady) {
      cudaGetLastError();  // clear a non-sticky error
      FailAndAbort(absl::InternalError(absl::StrCat(desc_, ": CUDA error while polling its event: ",
                                                    cudaGetErrorName(e), ": ",
                                                    cudaGetErrorString(e),
                                                    "; the communicator is now aborted")));
      return true;
    }
    if (CheckAsyncLocked()) return true;
    if (absl::Now() >= deadline_) {
      FailAndAbort(absl::DeadlineExceededError(absl::StrCat(
          desc_, " timed out after ", absl::FormatDuration(timeout_),
          " (not complete on the GPU): ranks that did not arrive: unknown (NCCL cannot report "
          "which ranks are missing); the communicator is now aborted (ncclCommAbort) and later "
          "operations on it fail")));
      return true;
    }
    return false;
  }

  std::shared_ptr<CommState> st_;
  const uint64_t flight_id_;
  std::string desc_;
  uint64_t order_;
  absl::Duration timeout_;
  absl::Time deadline_;
  bool done_ = false;
  bool ordered_ = false;
  bool watched_ = false;
  absl::Status status_;
};

// Polls the ops left to the stream every few milliseconds until they finish
// (the poll applies the op timeout and the async-error check). One
// communicator's ops finish in issue order on its stream, so a sweep polls
// from the oldest and stops at the first unfinished one: a step's worth of
// queued ops costs one event query, not one each. A finished op is released
// outside the lock: its destructor returns its event under it.
void WatchdogLoop(CommState* st) {
  DeviceScope ds(st->device);
  std::unique_lock<std::mutex> l(st->mu);
  while (!st->watchdog_stop) {
    st->watchdog_cv.wait_for(l, std::chrono::milliseconds(st->watched.empty() ? 100 : 5));
    std::vector<std::shared_ptr<NcclWork>> finished;
    auto& w = st->watched;
    while (!w.empty() && w.begin()->second->PollForWatchdogLocked()) {
      finished.push_back(std::move(w.begin()->second));
      w.erase(w.begin());
    }
    if (!finished.empty()) {
      l.unlock();
      finished.clear();
      l.lock();
    }
  }
}

void StartWatchdogLocked(const std::shared_ptr<CommState>& st) {
  if (!st->watchdog.joinable()) st->watchdog = std::thread(WatchdogLoop, st.get());
}

// Stops the watchdog and releases the ops it still held (the communicator is
// going away; the GPU finishes them in stream order, and the compute stream
// already waits for each one).
void StopWatchdog(CommState* st) {
  std::map<uint64_t, std::shared_ptr<NcclWork>> left;
  {
    std::lock_guard<std::mutex> l(st->mu);
    st->watchdog_stop = true;
    left.swap(st->watched);
  }
  st->watchdog_cv.notify_all();
  if (st->watchdog.joinable()) st->watchdog.join();
  left.clear();
}

// An all-to-all as one NCCL group: this rank's own block by a device copy
// (if `copy_own`), then a send and a receive per peer. Block j of `src` and
// `dst` is [off[j], off[j + 1]) bytes (internal::BlockOffsets). Empty blocks
// are skipped on both sides (their counts match, comm.h), so every non-empty
// pair is one send meeting one receive.
ncclResult_t GroupedAllToAll(const char* src, const std::vector<size_t>& send_off, char* dst,
                             const std::vector<size_t>& recv_off, DType dtype, int rank,
                             bool copy_own, ncclComm_t c, cudaStream_t s) {
  const int n = static_cast<int>(send_off.size()) - 1;
  const size_t es = core::DTypeSize(dtype);
  const size_t own = send_off[rank + 1] - send_off[rank];
  if (copy_own && own > 0 &&
      cudaMemcpyAsync(dst + recv_off[rank], src + send_off[rank], own, cudaMemcpyDeviceToDevice,
                      s) != cudaSuccess) {
    return ncclUnhandledCudaError;
  }
  if (n == 1) return ncclSuccess;
  const ncclDataType_t t = TypeOf(dtype);
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) return res;
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    const size_t send = (send_off[j + 1] - send_off[j]) / es;
    const size_t recv = (recv_off[j + 1] - recv_off[j]) / es;
    if (send > 0) res = ncclSend(src + send_off[j], send, t, j, c, s);
    if (res != ncclSuccess && res != ncclInProgress) break;
    if (recv > 0) res = ncclRecv(dst + recv_off[j], recv, t, j, c, s);
    if (res != ncclSuccess && res != ncclInProgress) break;
  }
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess && res != ncclInProgress ? res : end;
}

// Enqueues NCCL calls on the NCCL stream; returns what the last NCCL call
// returned (ncclInProgress allowed).
using Enqueue = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;
// Runs once the enqueue has settled (stream-ordered clean-up).
using After = std::function<void(cudaStream_t stream)>;

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<CommState> st) : st_(std::move(st)) {}
  ~NcclCommunicator() override { StopWatchdog(st_.get()); }

  int rank() const override { return st_->rank; }
  int size() const override { return st_->size; }
  core::Device device() const override { return core::Device::CUDA(st_->device); }
  const std::string& group_name() const override { return st_->name; }
  const char* backend_name() const override { return "nccl"; }
  using Communicator::AllReduce;
  using Communicator::Broadcast;

  WorkPtr AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) override {
    if (auto s = CheckAllReduce(in, out, device()); !s.ok()) return Fail("all_reduce", s);
    const size_t n = in.numel();
    return Issue("all_reduce", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      return ncclAllReduce(in.raw_data(), out.raw_data(), n, TypeOf(in.dtype()), OpOf(op), c, s);
    });
  }

  WorkPtr Broadcast(const Tensor& in, const Tensor& out, int root) override {
    if (auto s = CheckBroadcast(in, out, root, size(), device()); !s.ok()) {
      return Fail("broadcast", s);
    }
    const size_t n = in.numel();
    return Issue("broadcast", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      return ncclBroadcast(in.raw_data(), out.raw_data(), n, TypeOf(in.dtype()), root, c, s);
    });
  }

  WorkPtr Reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root) override {
    if (auto s = CheckReduce(in, out, root, size(), device()); !s.ok()) return Fail("reduce", s);
    const size_t n = in.numel();
    return Issue("reduce", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      // recvbuff is only written at the root.
      return ncclReduce(in.raw_data(), out.raw_data(), n, TypeOf(in.dtype()), OpOf(op), root, c, s);
    });
  }

  WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    if (auto s = CheckAllGather(in, out, rank(), size(), device()); !s.ok()) {
      return Fail("all_gather", s);
    }
    const size_t n = in.numel();
    // In place (input at output slot `rank`) is NCCL's own convention.
    return Issue("all_gather", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      return ncclAllGather(in.raw_data(), out.raw_data(), n, TypeOf(in.dtype()), c, s);
    });
  }

  WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    if (auto s = CheckReduceScatter(in, out, rank(), size(), device()); !s.ok()) {
      return Fail("reduce_scatter", s);
    }
    const size_t n = out.numel();
    // In place (output at input slot `rank`) is NCCL's own convention.
    return Issue("reduce_scatter", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      if (n == 0) return ncclSuccess;
      return ncclReduceScatter(in.raw_data(), out.raw_data(), n, TypeOf(in.dtype()), OpOf(op), c,
                               s);
    });
  }

  WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    if (auto s = CheckAllToAll(in, out, size(), device()); !s.ok()) return Fail("all_to_all", s);
    const int n = size();
    const std::vector<size_t> off = internal::BlockOffsets(
        std::vector<int64_t>(n, in.numel() / n), core::DTypeSize(in.dtype()));
    const bool in_place = in.raw_data() == out.raw_data();
    auto scratch = std::make_shared<void*>(nullptr);
    return Issue(
        "all_to_all", {in, out},
        [&, scratch](ncclComm_t c, cudaStream_t s) -> ncclResult_t {
          if (in.numel() == 0 || (in_place && n == 1)) return ncclSuccess;
          const char* src = static_cast<const char*>(in.raw_data());
          if (in_place) {
            // Sends must read the input while receives overwrite it: stage it.
            if (cudaMallocAsync(scratch.get(), in.nbytes(), s) != cudaSuccess ||
                cudaMemcpyAsync(*scratch, src, in.nbytes(), cudaMemcpyDeviceToDevice, s) !=
                    cudaSuccess) {
              return ncclUnhandledCudaError;
            }
            src = static_cast<const char*>(*scratch);
          }
          // In place, the own block is already where it belongs.
          return GroupedAllToAll(src, off, static_cast<char*>(out.raw_data()), off, in.dtype(),
                                 rank(), /*copy_own=*/!in_place, c, s);
        },
        [scratch](cudaStream_t s) {
          if (*scratch != nullptr) cudaFreeAsync(*scratch, s);  // after the group's kernels
        });
  }

  WorkPtr AllToAllV(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    if (auto s = CheckAllToAllV(in, send_counts, out, recv_counts, rank(), size(), device());
        !s.ok()) {
      return Fail("all_to_all_v", s);
    }
    const size_t es = core::DTypeSize(in.dtype());
    const std::vector<size_t> send_off = internal::BlockOffsets(send_counts, es);
    const std::vector<size_t> recv_off = internal::BlockOffsets(recv_counts, es);
    return Issue("all_to_all_v", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      return GroupedAllToAll(static_cast<const char*>(in.raw_data()), send_off,
                             static_cast<char*>(out.raw_data()), recv_off, in.dtype(), rank(),
                             /*copy_own=*/true, c, s);
    });
  }

  WorkPtr Send(const Tensor& t, int peer, int tag) override {
    if (auto s = CheckP2P("send", t, peer, tag, rank(), size(), device()); !s.ok()) {
      return Fail("send", s, /*point_to_point=*/true);
    }
    return P2P("send", {{P2POp::Kind::kSend, t, peer, tag}});
  }
  WorkPtr Recv(const Tensor& t, int peer, int tag) override {
    if (auto s = CheckP2P("recv", t, peer, tag, rank(), size(), device()); !s.ok()) {
      return Fail("recv", s, /*point_to_point=*/true);
    }
    return P2P("recv", {{P2POp::Kind::kRecv, t, peer, tag}});
  }
  WorkPtr BatchSendRecv(const std::vector<P2POp>& ops) override {
    if (auto s = CheckBatch(ops, rank(), size(), device()); !s.ok()) {
      return Fail("batch_send_recv", s, /*point_to_point=*/true);
    }
    return P2P("batch_send_recv", ops);
  }

  WorkPtr Barrier() override { return BarrierWithin(absl::ZeroDuration()); }
  WorkPtr BarrierWithin(absl::Duration op_timeout) override {
    // A one-element all-reduce; Wait returns once every rank has joined it.
    return Issue(
        "barrier", {},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclAllReduce(st_->barrier_buf, st_->barrier_buf, 1, ncclFloat32, ncclSum, c, s);
        },
        nullptr, op_timeout);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                       const std::string& name) override {
    std::unique_lock<std::mutex> l(st_->mu);
    const std::string what = absl::StrCat("split of ", st_->Who(), " into '", name, "'");
    if (!st_->aborted.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": the communicator was aborted by an earlier error: ", st_->aborted.message()));
    }
    DeviceScope ds(st_->device);
    if (!ds.status().ok()) return ds.status();
    auto child = std::make_shared<CommState>();
    child->device = st_->device;
    child->name = name;
    child->timeout = st_->timeout;
    child->world_rank = st_->world_rank;
    child->flight_dir = st_->flight_dir;
    child->flight_entries = st_->flight_entries;
    ncclConfig_t config = NonBlockingConfig(child->name);
    ncclComm_t comm = nullptr;
    const absl::Time deadline = absl::Now() + st_->timeout;
    ncclResult_t r = ncclCommSplit(st_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm,
                                   &config);
    if (r == ncclInProgress || r == ncclSuccess) {
      // Both the parent and the child may be busy until every rank took part.
      r = SettleLocked(l, st_.get(), st_->comm, ncclInProgress, deadline);
      if (r == ncclSuccess && comm != nullptr) {
        r = SettleLocked(l, st_.get(), comm, ncclInProgress, deadline);
      }
    }
    if (!st_->aborted.ok()) {  // by the watchdog, while the lock was released
      if (comm != nullptr) ncclCommAbort(comm);
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": the communicator was aborted meanwhile: ", st_->aborted.message()));
    }
    if (r != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      absl::Status s =
          r == ncclInProgress
              ? absl::DeadlineExceededError(absl::StrCat(
                    what, " did not complete within ", absl::FormatDuration(st_->timeout),
                    ": ranks that did not arrive: unknown (NCCL cannot report which ranks are "
                    "missing); the parent communicator is now aborted"))
              : NcclStatus(r, absl::StrCat(what, " (the parent communicator is now aborted)"));
      st_->AbortLocked(s);
      return s;
    }
    if (comm == nullptr) return std::unique_ptr<Communicator>();  // color < 0
    child->comm = comm;
    if (ncclCommUserRank(comm, &child->rank) != ncclSuccess ||
        ncclCommCount(comm, &child->size) != ncclSuccess) {
      return absl::InternalError(absl::StrCat(what, ": cannot read the child's rank and size"));
    }
    if (absl::Status s = child->Init(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    child->StartRecorder();
    return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(child)));
  }

 private:
  // An argument error (comm.h): the handle fails with it, and the op still
  // takes its sequence number and aborts the communicator. NCCL matches ops
  // by issue order alone, so without the abort this rank's next op would
  // pair with the other ranks' copy of the rejected one, silently when
  // count and dtype agree.
  WorkPtr Fail(const char* what, const absl::Status& s, bool point_to_point = false) {
    std::lock_guard<std::mutex> l(st_->mu);
    const uint64_t seq = point_to_point ? st_->p2p_seq++ : st_->seq++;
    ++st_->issued;
    st_->recorder->Complete(st_->recorder->Issue(FlightKind(what), seq, DType::kU8, 0), false);
    std::string desc = absl::StrCat(what, " #", seq, " in ", st_->Who());
    absl::Status error(s.code(), absl::StrCat(desc, ": ", s.message()));
    st_->AbortLocked(error);
    return CompletedWork(error, desc);
  }

  static flight::OpKind FlightKind(const char* what) {
    flight::OpKind k = flight::OpKind::kAllGather;
    flight::ParseOpKind(what, &k);
    return k;
  }

  // `point_to_point`: numbered in the point-to-point sequence.
  WorkPtr Issue(const char* what, std::vector<Tensor> keep, const Enqueue& enqueue,
                const After& after = nullptr, absl::Duration op_timeout = absl::ZeroDuration(),
                bool point_to_point = false) {
    std::unique_lock<std::mutex> l(st_->mu);
    const uint64_t seq = point_to_point ? st_->p2p_seq++ : st_->seq++;
    uint64_t bytes = 0;
    for (size_t i = 0; i < keep.size() && (i == 0 || point_to_point); ++i) {
      bytes += keep[i].nbytes();  // the input (a batch: every leg)
    }
    const uint64_t flight_id = st_->recorder->Issue(
        FlightKind(what), seq, keep.empty() ? DType::kU8 : keep[0].dtype(), bytes);
    auto w = std::make_shared<NcclWork>(st_, absl::StrCat(what, " #", seq, " in ", st_->Who()),
                                        st_->issued++, flight_id, op_timeout);
    if (!st_->aborted.ok()) {
      w->FailNow(absl::FailedPreconditionError(absl::StrCat(
          w->Describe(), ": the communicator was aborted by an earlier error: ",
          st_->aborted.message())));
      return w;
    }
    DeviceScope ds(st_->device);
    if (!ds.status().ok()) {
      w->FailNow(Annotate(ds.status(), w->Describe()));
      return w;
    }
    // Order the op after everything queued on the caller's compute stream.
    absl::StatusOr<cudaStream_t> compute = core::cuda::CurrentStream();
    if (!compute.ok()) {
      w->FailNow(Annotate(compute.status(), w->Describe()));
      return w;
    }
    absl::StatusOr<cudaEvent_t> done = st_->TakeEvent();
    if (!done.ok()) {
      w->FailNow(Annotate(done.status(), w->Describe()));
      return w;
    }
    w->done_event_ = *done;
    cudaError_t e = cudaEventRecord(st_->ready, *compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(st_->stream, st_->ready, 0);
    if (e != cudaSuccess) {
      w->FailNow(Annotate(core::cuda::CudaStatus(e, "ordering after the compute stream",
                                                 __FILE__, __LINE__),
                          w->Describe()));
      return w;
    }
    ncclResult_t r = SettleLocked(l, st_.get(), st_->comm, enqueue(st_->comm, st_->stream),
                                  w->deadline());
    if (!st_->aborted.ok()) {  // by the watchdog, while the lock was released
      w->FailNow(absl::FailedPreconditionError(absl::StrCat(
          w->Describe(), ": the communicator was aborted by an earlier error: ",
          st_->aborted.message())));
      return w;
    }
    if (r != ncclSuccess) {
      absl::Status s;
      if (r == ncclInProgress) {
        s = absl::DeadlineExceededError(absl::StrCat(
            w->Describe(), " could not be enqueued within ", absl::FormatDuration(st_->timeout),
            " (NCCL was still connecting to its peers): ranks that did not arrive: unknown; the "
            "communicator is now aborted"));
      } else {
        s = NcclStatus(r, absl::StrCat(w->Describe(), " (the communicator is now aborted)"));
      }
      w->FailNow(s);
      st_->AbortLocked(s);  // the enqueue may be half done: the communicator is unusable
      return w;
    }
    w->Started();  // enqueued on the stream
    if (after) after(st_->stream);
    e = cudaEventRecord(w->done_event_, st_->stream);
    if (e != cudaSuccess) {
      absl::Status s = Annotate(
          core::cuda::CudaStatus(e, "cudaEventRecord(op done)", __FILE__, __LINE__),
          absl::StrCat(w->Describe(), " (the communicator is now aborted)"));
      w->FailNow(s);
      st_->AbortLocked(s);
      return w;
    }
    w->recorded_ = true;
    w->keep = std::move(keep);
    return w;
  }

  // Sends and receives in one NCCL group. NCCL matches the messages between
  // a pair in issue order; within a batch they are ordered by tag (stable),
  // so two ranks that batch the same messages in different orders agree.
  WorkPtr P2P(const char* what, std::vector<P2POp> ops) {
    std::stable_sort(ops.begin(), ops.end(),
                     [](const P2POp& a, const P2POp& b) { return a.tag < b.tag; });
    std::vector<Tensor> keep;
    for (const P2POp& op : ops) keep.push_back(op.tensor);
    return Issue(what, std::move(keep), [&](ncclComm_t c, cudaStream_t s) -> ncclResult_t {
      ncclResult_t res = ncclGroupStart();
      if (res != ncclSuccess) return res;
      for (const P2POp& op : ops) {
        const size_t n = op.tensor.numel();
        if (n == 0) continue;  // both sides skip it (counts must match)
        res = op.kind == P2POp::Kind::kSend
                  ? ncclSend(op.tensor.raw_data(), n, TypeOf(op.tensor.dtype()), op.peer, c, s)
                  : ncclRecv(op.tensor.raw_data(), n, TypeOf(op.tensor.dtype()), op.peer, c, s);
        if (res != ncclSuccess && res != ncclInProgress) break;
      }
      ncclResult_t end = ncclGroupEnd();
      return res != ncclSuccess && res != ncclInProgress ? res : end;
    }, nullptr, absl::ZeroDuration(), /*point_to_point=*/true);
  }

  static absl::Status Annotate(const absl::Status& s, const std::string& context) {
    return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
  }

  std::shared_ptr<CommState> st_;
};

}  // namespace

std::string LinkedNcclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // Since 2.9: major * 10000 + minor * 100 + patch.
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

absl::StatusOr<std::unique_ptr<Communicator>> Create(int rank, int size,
                                                     std::shared_ptr<Store> store,
                                                     const NcclOptions& options) {
  const std::string& group = options.comm.group_name;
  const std::string who = absl::StrCat("nccl backend, group '", group, "', rank ", rank, " of ", size);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": rank out of range"));
  }
  if (!store) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank 0 publishes NCCL's unique id through a store: pass one"));
  }
  absl::StatusOr<int> count = core::cuda::VisibleDeviceCount();
  if (!count.ok()) {
    return absl::UnavailableError(
        absl::StrCat(who, ": no usable GPU (NCCL needs one per rank): ", count.status().message()));
  }
  // The local rank mod the visible GPUs: with one GPU visible per task
  // (CUDA_VISIBLE_DEVICES set per rank by Slurm), every rank uses its cuda:0.
  const int device = options.device >= 0 ? options.device
                                         : (*count > 0 ? options.local_rank % *count : 0);
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": CUDA device ", device,
        options.device >= 0 ? " (NcclOptions::device)" : " (= the local rank mod the GPU count)",
        " does not exist; this machine has ", *count,
        " GPU(s). NCCL refuses two ranks of one communicator on the same GPU: start at most ",
        *count, " ranks per node"));
  }
  const int64_t generation =
      options.generation >= 0 ? options.generation : NextGeneration(group);
  const std::string key = absl::StrCat("nccl/", group, "/gen", generation, "/unique_id");
  const absl::Time deadline = absl::Now() + options.comm.timeout;

  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclStatus(r, absl::StrCat(who, ": ncclGetUniqueId"));
    absl::Status s = store->Set(
        key, absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal))));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(who, ": publishing the unique id: ", s.message()));
    }
  } else {
    absl::StatusOr<std::string> hex = store->Get(key, options.comm.timeout);
    if (!hex.ok()) {
      return absl::Status(hex.status().code(),
                          absl::StrCat(who, ": waiting for rank 0's unique id (", key, " in ",
                                       store->Describe(), "): ", hex.status().message()));
    }
    std::string bytes = absl::HexStringToBytes(*hex);
    if (bytes.size() != sizeof(id.internal)) {
      return absl::InternalError(absl::StrCat(who, ": ", key, " holds ", bytes.size(),
                                              " bytes, expected an ncclUniqueId of ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }

  auto st = std::make_shared<CommState>();
  st->device = device;
  st->rank = rank;
  st->size = size;
  st->name = group;
  st->timeout = options.comm.timeout;
  DeviceScope ds(device);
  if (!ds.status().ok()) return ds.status();
  ncclConfig_t config = NonBlockingConfig(st->name);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  r = Settle(comm, r, deadline);
  if (r != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    if (r == ncclInProgress) {
      return absl::DeadlineExceededError(absl::StrCat(
          who, " (cuda:", device, "): NCCL initialisation did not complete within ",
          absl::FormatDuration(options.comm.timeout),
          ": ranks that did not arrive: unknown (NCCL cannot report which ranks are missing); "
          "the half-built communicator was aborted. Is every rank running, one per GPU?"));
    }
    return NcclStatus(r, absl::StrCat(who, " (cuda:", device, "): ncclCommInitRankConfig"));
  }
  st->comm = comm;
  if (absl::Status s = st->Init(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
  }
  st->world_rank = rank;
  st->flight_dir = options.comm.flight_recorder_dir;
  st->flight_entries = options.comm.flight_recorder_entries;
  st->StartRecorder();
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(st)));
}

}  // namespace loom::comm::nccl
