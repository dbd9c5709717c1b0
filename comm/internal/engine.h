#ifndef LOOM_COMM_INTERNAL_ENGINE_H_
#define LOOM_COMM_INTERNAL_ENGINE_H_

// Our own communicator over a Transport, shared by the local and UCX
// backends. It checks arguments (checks.h), numbers operations, turns the
// steps of our collective algorithms (algorithms.h) and the user's
// point-to-point messages into tagged transport messages, and splits groups.
// When and on which thread operations run is the scheduler's (scheduler.h):
// one at a time in issue order, run by a waiting thread or a background
// worker. Staging buffers are owned by the communicator and reused.
//
// Numbering and tags (transport.h): collectives are numbered in one sequence
// and their messages carry (sequence, step), so every rank must issue the
// same collectives in the same order; point-to-point ops are numbered in a
// sequence of their own (for descriptions only) and their messages carry the
// user's tag in a separate tag space, so any amount of point-to-point
// traffic leaves the collectives' numbering alone. Every message also
// carries a signature of its call, checked by the receiver. An op rejected by
// the argument checks still takes its number and aborts the communicator
// (Scheduler::Reject): otherwise this rank's next op would pair with the
// other ranks' rejected one.
//
// Context ids (the `ctx` of tags): a communicator's is unique among the
// communicators over its transport endpoint that are alive or were before
// (late messages of a destroyed one never reach a new one). Split chooses
// them with the other members (see ContextIds in engine.cc), so concurrent
// Splits of different communicators over one endpoint never share one.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/comm.h"
#include "comm/flight/recorder.h"
#include "comm/internal/algorithms.h"
#include "comm/internal/scheduler.h"
#include "comm/internal/transport.h"
#include "core/memory_stats.h"

namespace loom::comm::internal {

struct EngineOptions {
  CommOptions comm;
  // All-reduce switches to the ring above this; all-to-all to pairwise
  // exchange above this many bytes moved by a rank.
  size_t small_bytes = 64 << 10;
};

class ContextIds;

class Engine : public Communicator {
 public:
  // `members[i]` is the transport rank of group rank i; this endpoint is one
  // of them. `ctx` distinguishes this group's messages (see Split). Every
  // communicator over `transport` must descend (Split) from this one: the
  // backends make one such root per endpoint.
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
  WorkPtr AllToAllV(const core::Tensor& input, const std::vector<int64_t>& send_counts,
                    const core::Tensor& output, const std::vector<int64_t>& recv_counts) override;
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
  using Op = Scheduler::Op;
  class OpSteps;
  template <typename Algorithm>
  class CollectiveTask;

  // A child made by Split: shares `contexts` with its parent.
  Engine(std::shared_ptr<Transport> transport, std::vector<int> members, uint32_t ctx,
         EngineOptions options, const char* backend_name, std::shared_ptr<ContextIds> contexts);

  // Queues a collective (the next number of the collective sequence), its
  // messages signed with `sig`; `run` runs its algorithm. `timeout`: the
  // op's limit; zero means CommOptions::timeout.
  // (A template defined and used in engine.cc.)
  // `kind`, `dtype`, `bytes`, `root` go to the flight recorder.
  template <typename Run>
  WorkPtr Collective(const char* name, flight::OpKind kind, core::DType dtype, uint64_t bytes,
                     int root, uint32_t sig, Run run,
                     absl::Duration timeout = absl::ZeroDuration());
  // Queues point-to-point ops (the next number of the point-to-point
  // sequence). `wait_sends`: false for a single Send, which then completes
  // in the background.
  WorkPtr PointToPoint(const char* name, flight::OpKind kind, std::vector<P2POp> ops,
                       bool wait_sends);
  // An op whose arguments failed the checks: it takes the next number of
  // `sequence` (next_seq_ or next_p2p_seq_) and aborts the communicator.
  // `kind`, `dtype`, `bytes`: what the flight recorder notes of the call.
  WorkPtr Fail(const char* name, flight::OpKind kind, const core::Tensor& tensor,
               uint32_t& sequence, absl::Status status);

  // Sends/receives all legs of one algorithm step of `op` and waits for them.
  // `op.task` owns the op's tensors; when the wait fails, the requests not
  // done are cancelled and the transport keeps the task and the staging
  // while it may still touch them (comm.h, FAILURE).
  absl::Status Exchange(Op& op, uint32_t sig, absl::Span<const Leg> legs);
  // The same for point-to-point ops (`ops` owns their tensors).
  absl::Status P2P(Op& op, const std::shared_ptr<const std::vector<P2POp>>& ops, bool wait_sends);
  char* Stage(int i, size_t bytes);
  // Charges (or credits) staging buffer i's change to `bytes` to ledger_.
  void ChargeStaging(int i, size_t bytes);

  std::shared_ptr<Transport> transport_;
  std::shared_ptr<ContextIds> contexts_;  // shared by every Engine over transport_
  std::vector<int> members_;
  int rank_ = 0;
  uint32_t ctx_;
  EngineOptions options_;
  const char* backend_name_;
  uint32_t next_seq_ = 0;      // collectives; issuing thread only
  uint32_t next_p2p_seq_ = 0;  // point-to-point; issuing thread only
  std::shared_ptr<flight::Recorder> recorder_;  // this communicator's ring

  // Executor state (used by the op running, one at a time).
  std::vector<char> stage_[2];
  // The staging is charged as communication to the ledger of the thread that
  // made this communicator (the rank's, core/memory_stats.h).
  std::shared_ptr<core::MemoryLedger> ledger_ = core::CurrentMemoryLedger();
  size_t staged_bytes_[2] = {0, 0};
  std::vector<TransportReq*> exchange_ptrs_;
  std::unique_ptr<Scheduler> scheduler_;  // last: stopped before the rest goes
};

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_ENGINE_H_
