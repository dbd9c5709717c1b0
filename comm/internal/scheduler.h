#ifndef LOOM_COMM_INTERNAL_SCHEDULER_H_
#define LOOM_COMM_INTERNAL_SCHEDULER_H_

// The progress scheduler of our own communicators (engine.h): it decides
// when and on which thread each operation runs, and when it has failed. It
// knows nothing of what an operation does.
//  * Queueing: operations run one at a time, in issue order.
//  * Helping: a thread waiting on a handle runs the queued operations itself,
//    up to its own (no hand-off latency), each only if it ends (at its own
//    limit) before the wait does, and polls the sends left to the
//    background. Between tries it sleeps until the handle finishes or for a
//    nap that grows with the wait: waiting costs no core.
//  * Async progress: a worker thread per communicator runs what nobody waits
//    for, once it has sat unclaimed for a grace period (no wake-up per op),
//    and polls sends that finish in the background (less often the longer
//    none finishes).
//  * Deadlines: an operation's limit counts from when it starts; a send left
//    to the background keeps its deadline.
//  * Abort: the first failure aborts the scheduler; later operations fail
//    with FailedPrecondition naming it. An argument error (Reject) aborts it
//    from its place in the queue. Shutdown cancels what is left.
//  * Flight recorder (comm/flight/recorder.h): the engine records an op when
//    it issues it and passes its id; the scheduler records when it starts
//    and when its handle finishes, and has the recorder dump when a failure
//    (not a shutdown) aborts it.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/comm.h"
#include "comm/flight/recorder.h"
#include "comm/internal/transport.h"

namespace loom::comm::internal {

class ScheduledWork;
struct SchedulerLink;

class Scheduler {
 public:
  // Who this scheduler serves, for descriptions ("all_reduce #3 in group
  // 'tp' (local backend, rank 0 of 2)").
  struct Names {
    std::string group;
    const char* backend;
    int rank, size;
  };

  struct Op;
  // What an operation does (the engine's collectives derive from it: the op
  // and its arguments in one allocation, called without a std::function).
  class Task {
   public:
    virtual ~Task() = default;
    virtual absl::Status Run(Op& op) = 0;
  };

  // One operation, as the scheduler runs it.
  struct Op {
    std::shared_ptr<ScheduledWork> work;  // null once left to the background
    uint32_t seq;                         // its number, for descriptions
    std::shared_ptr<Task> task;           // holds the op's arguments while it lives
    absl::Time deadline;                  // while queued: when first seen queued (InfinitePast: not
                                          // yet; QueuedPastGrace); once started: its deadline
    absl::Duration timeout;  // its own limit, from when it starts
    uint64_t flight_id = 0;  // its entry in the flight recorder
    // "all_reduce #3 in group 'tp' (local backend, rank 0 of 2)".
    std::string Describe() const;
  };

  // `transport` progresses and cancels the sends left to the background;
  // `timeout` is CommOptions::timeout (an operation's default limit);
  // `recorder` (may be null) is the communicator's flight recorder.
  Scheduler(std::shared_ptr<Transport> transport, Names names, absl::Duration timeout,
            std::shared_ptr<flight::Recorder> recorder = nullptr);
  ~Scheduler();  // Shutdown()

  // Queues `run` (named `name`, numbered `seq` in descriptions) with its own
  // limit `timeout` (zero: the default) and returns its handle. `flight_id`:
  // the op's id in the recorder (Recorder::Issue; ignored without one).
  WorkPtr Enqueue(const char* name, uint32_t seq, std::function<absl::Status(Op&)> run,
                  absl::Duration timeout = absl::ZeroDuration(), uint64_t flight_id = 0);
  // The same with the op as a Task.
  WorkPtr Enqueue(const char* name, uint32_t seq, std::shared_ptr<Task> task,
                  absl::Duration timeout = absl::ZeroDuration(), uint64_t flight_id = 0);

  // An operation that failed its argument checks, numbered `seq` like the
  // others: its handle fails at once with `error`. It still aborts the
  // scheduler, in issue order (operations queued before it run; later ones
  // fail naming it): the other ranks' operation with this number can never
  // complete, and this rank's next one must not pair with it.
  WorkPtr Reject(const char* name, uint32_t seq, absl::Status error, uint64_t flight_id = 0);

  // Called by a running op: its send `req` (to group rank `peer`) completes
  // in the background; the op's handle finishes with it, or fails at the
  // op's deadline. The op returns right after.
  void FinishInBackground(Op& op, std::unique_ptr<TransportReq> req, int peer);

  // True once the scheduler shuts down: transports stop waiting (Cancelled).
  const std::atomic<bool>& abort_flag() const { return abort_flag_; }

  // Stops the worker: queued and running operations fail with Cancelled.
  void Shutdown();

 private:
  friend class ScheduledWork;

  WorkPtr Push(Op op);
  void WorkerLoop();
  // Caller holds the exec lock (link_->exec_mu). Runs the next queued op (or fails it, once
  // aborted); false if there is none, or if it might not end (at its own
  // limit) by `must_end_by`. `now`: the time, if the caller just read it
  // (InfinitePast: read it here).
  bool RunNext(absl::Time must_end_by = absl::InfiniteFuture(),
               absl::Time now = absl::InfinitePast());
  // `now`: as for RunNext.
  void RunOp(Op& op, absl::Time now = absl::InfinitePast());
  // Caller holds the exec lock (link_->exec_mu). Finishes the sends left to the background that
  // are done or past their deadline; true if any finished.
  bool PollPendingSends();
  // Called by a thread waiting on `work` until `wait_deadline`, between
  // naps, holding the exec lock (no other thread is executing): runs the
  // queued operations up to `work` that end by `wait_deadline`, and polls
  // the pending sends. `now`: the time the caller just read.
  void Help(ScheduledWork* work, absl::Time wait_deadline, absl::Time now);
  // Wakes the worker if the oldest queued op has waited past the grace period.
  void MaybeWakeWorker();
  // Caller holds mu_. Whether the oldest queued op has sat past the grace
  // period; stamps it `now` if nobody looked before.
  bool QueuedPastGrace(absl::Time now);
  // The first failure aborted the scheduler: the recorder dumps (no lock held).
  void Aborted(const absl::Status& status);

  std::shared_ptr<Transport> transport_;
  const absl::Duration timeout_;
  const std::shared_ptr<flight::Recorder> recorder_;
  std::shared_ptr<SchedulerLink> link_;  // shared with the handles; its exec_mu is
                                         // held while executing operations
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  absl::Status aborted_;  // first fatal error (guarded by mu_)
  std::atomic<bool> abort_flag_{false};

  // Executor state (guarded by the exec lock).
  std::atomic<int> num_pending_{0};
  struct PendingSend {
    std::shared_ptr<ScheduledWork> work;
    std::unique_ptr<TransportReq> req;
    absl::Time deadline;
    int peer;
  };
  std::vector<PendingSend> pending_sends_;
  std::thread worker_;
};

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_SCHEDULER_H_
