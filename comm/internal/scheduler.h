#ifndef LOOM_COMM_INTERNAL_SCHEDULER_H_
#define LOOM_COMM_INTERNAL_SCHEDULER_H_

// The progress scheduler of our own communicators (engine.h): it decides
// when and on which thread each operation runs, and when it has failed. It
// knows nothing of what an operation does.
//  * Queueing: operations run one at a time, in issue order.
//  * Helping: a thread waiting on a handle runs the queued operations itself,
//    up to its own (no hand-off latency), when its wait would last as long as
//    an operation may anyway.
//  * Async progress: a worker thread per communicator runs what nobody waits
//    for, once it has sat unclaimed for a grace period (no wake-up per op),
//    and progresses sends that finish in the background.
//  * Deadlines: an operation's limit counts from when it starts; a send left
//    to the background keeps its deadline.
//  * Abort: the first failure aborts the scheduler; later operations fail
//    with FailedPrecondition naming it. Shutdown cancels what is left.

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

  // One operation, as the scheduler runs it.
  struct Op {
    std::shared_ptr<ScheduledWork> work;  // null once left to the background
    uint32_t seq;                         // its number, for descriptions
    std::function<absl::Status(Op&)> run;
    absl::Time deadline;  // while queued: when it was issued; once started: its deadline
    absl::Duration timeout;  // its own limit, from when it starts
    // "all_reduce #3 in group 'tp' (local backend, rank 0 of 2)".
    std::string Describe() const;
  };

  // `transport` progresses and cancels the sends left to the background;
  // `timeout` is CommOptions::timeout (an operation's default limit).
  Scheduler(std::shared_ptr<Transport> transport, Names names, absl::Duration timeout);
  ~Scheduler();  // Shutdown()

  // Queues `run` (named `name`, numbered `seq` in descriptions) with its own
  // limit `timeout` (zero: the default) and returns its handle.
  WorkPtr Enqueue(const char* name, uint32_t seq, std::function<absl::Status(Op&)> run,
                  absl::Duration timeout = absl::ZeroDuration());

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

  void WorkerLoop();
  // Caller holds exec_mu_. Runs the next queued op; false if none.
  bool RunNext();
  void RunOp(Op& op);
  void PollPendingSends(bool force_deadline_check);
  // Called by a thread waiting on `work` until `wait_deadline`: if no other
  // thread is executing and the wait outlasts an op's timeout, runs queued
  // operations until `work` is done. False if it did not.
  bool HelpUntil(ScheduledWork* work, absl::Time wait_deadline);
  // Wakes the worker if the oldest queued op has waited past the grace period.
  void MaybeWakeWorker();

  std::shared_ptr<Transport> transport_;
  const absl::Duration timeout_;
  std::shared_ptr<SchedulerLink> link_;  // shared with the handles
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
