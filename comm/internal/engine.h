#ifndef LOOM_COMM_INTERNAL_ENGINE_H_
#define LOOM_COMM_INTERNAL_ENGINE_H_

// Our own collective algorithms over a Transport, shared by the local and UCX
// backends. Operations run one at a time in issue order, each returning a
// Work handle. Who runs them: a thread waiting on a handle runs the queued
// operations itself up to its own (no hand-off latency); a background worker
// thread per communicator runs whatever nobody waits for (async progress). Algorithms (chosen by message size):
//   all-reduce   <= small_bytes: recursive doubling (power-of-two groups) or
//                all-to-all exchange + rank-ordered reduction; larger: ring
//                reduce-scatter + ring all-gather.
//   reduce-scatter / all-gather: ring.  broadcast / reduce: binomial tree.
//   all-to-all: all pairs at once.  barrier: dissemination.
// Every rank computes bitwise identical all-reduce results. Staging buffers
// are owned by the communicator and reused across calls.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/types/span.h"
#include "comm/comm.h"
#include "comm/internal/transport.h"

namespace loom::comm::internal {

struct EngineOptions {
  CommOptions comm;
  size_t small_bytes = 64 << 10;  // all-reduce switches to the ring above this
};

class EngineWork;
struct EngineHelper;

class Engine : public Communicator {
 public:
  // `members[i]` is the transport rank of group rank i; this endpoint is one
  // of them. `ctx` distinguishes this group's messages (see Split).
  Engine(std::shared_ptr<Transport> transport, std::vector<int> members, uint32_t ctx,
         EngineOptions options, const char* backend_name);
  ~Engine() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  core::Device device() const override { return core::Device::CPU(); }
  const std::string& group_name() const override { return options_.comm.group_name; }
  const char* backend_name() const override { return backend_name_; }

  WorkPtr AllReduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op) override;
  WorkPtr Broadcast(const core::Tensor& input, const core::Tensor& output, int root) override;
  WorkPtr Reduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op,
                 int root) override;
  WorkPtr AllGather(const core::Tensor& input, const core::Tensor& output) override;
  WorkPtr ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                        ReduceOp op) override;
  WorkPtr AllToAll(const core::Tensor& input, const core::Tensor& output) override;
  WorkPtr Send(const core::Tensor& tensor, int peer, int tag) override;
  WorkPtr Recv(const core::Tensor& tensor, int peer, int tag) override;
  WorkPtr BatchSendRecv(const std::vector<P2POp>& ops) override;
  WorkPtr Barrier() override;
  WorkPtr BarrierWithin(absl::Duration op_timeout) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                       const std::string& name) override;

  using Communicator::AllReduce;
  using Communicator::Broadcast;

  // Stops the worker: queued and running operations fail with Cancelled.
  void Shutdown();
  const std::shared_ptr<Transport>& transport() const { return transport_; }

 private:
  struct Leg {
    bool is_send;
    int peer;  // group rank
    int step;
    void* buf;
    size_t bytes;
  };
  struct Op {
    std::shared_ptr<EngineWork> work;
    uint32_t seq;
    std::function<absl::Status(Op&)> run;
    absl::Time deadline;  // while queued: the time it was issued
    uint32_t sig = 0;
    absl::Duration timeout;  // the op's own limit, from when it starts
  };

  // Collectives are numbered in one sequence (their message tags carry it, so
  // every rank must agree); point-to-point ops in another, since ranks issue
  // different numbers of them (pipeline stages) and are matched by user tag.
  // `timeout`: the op's limit; zero means CommOptions::timeout.
  WorkPtr Enqueue(const char* name, uint32_t sig, std::function<absl::Status(Op&)> run,
                  bool point_to_point = false, absl::Duration timeout = absl::ZeroDuration());
  WorkPtr Fail(const char* name, absl::Status status);
  void WorkerLoop();
  // Caller holds exec_mu_. Runs the next queued op; false if none.
  bool RunNext();
  void RunOp(Op& op);
  void PollPendingSends(bool force_deadline_check);

 public:
  // Called by a thread waiting on `work` until `wait_deadline`: if no other
  // thread is executing and the wait outlasts an op's timeout, runs queued
  // operations until `work` is done. False if it did not.
  bool HelpUntil(EngineWork* work, absl::Time wait_deadline);
  // Wakes the worker if the oldest queued op has waited past the grace period.
  void MaybeWakeWorker();

 private:

  // Sends/receives all legs of one algorithm step and waits for them.
  absl::Status Exchange(Op& op, absl::Span<const Leg> legs);
  absl::Status P2P(Op& op, const std::vector<P2POp>& ops, bool wait_sends);
  char* Stage(int i, size_t bytes);

  absl::Status RunAllReduce(Op& op, const core::Tensor& in, const core::Tensor& out, ReduceOp r);
  absl::Status RunBroadcast(Op& op, const core::Tensor& in, const core::Tensor& out, int root);
  absl::Status RunReduce(Op& op, const core::Tensor& in, const core::Tensor& out, ReduceOp r,
                         int root);
  absl::Status RunAllGather(Op& op, const core::Tensor& in, const core::Tensor& out);
  absl::Status RunReduceScatter(Op& op, const core::Tensor& in, const core::Tensor& out,
                                ReduceOp r);
  absl::Status RunAllToAll(Op& op, const core::Tensor& in, const core::Tensor& out);
  absl::Status RunBarrier(Op& op);

  std::shared_ptr<Transport> transport_;
  std::vector<int> members_;
  int rank_ = 0;
  uint32_t ctx_;
  EngineOptions options_;
  const char* backend_name_;
  uint32_t next_seq_ = 0;      // collectives; issuing thread only
  uint32_t next_p2p_seq_ = 0;  // point-to-point; issuing thread only

  std::shared_ptr<EngineHelper> helper_;
  std::mutex exec_mu_;  // held while executing operations
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  absl::Status aborted_;  // first fatal error (guarded by mu_)
  std::atomic<bool> abort_flag_{false};

  // Executor state (guarded by exec_mu_).
  std::atomic<int> num_pending_{0};
  struct PendingSend {
    std::shared_ptr<EngineWork> work;
    std::unique_ptr<TransportReq> req;
    absl::Time deadline;
    int peer;
  };
  std::vector<PendingSend> pending_sends_;
  std::vector<char> stage_[2];
  std::vector<TransportReq*> exchange_ptrs_;
  std::thread worker_;
};

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_ENGINE_H_
