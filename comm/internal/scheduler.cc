#include "comm/internal/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::comm::internal {

// What a handle needs of its scheduler: a way to help or wake it while it
// exists, and the names for its description.
struct SchedulerLink {
  // Held while executing operations (the scheduler's executor lock): a
  // waiting thread that holds it may help, as `scheduler` cannot go away
  // meanwhile (Shutdown takes it). One lock where a helper took two.
  std::mutex exec_mu;
  std::mutex mu;  // for Poll's wake-ups
  Scheduler* scheduler = nullptr;  // null once the scheduler shuts down (both locks held)
  absl::Duration default_timeout;     // CommOptions::timeout
  absl::Duration default_wait_limit;  // WaitLimit(default_timeout)
  Scheduler::Names names;
  std::shared_ptr<flight::Recorder> recorder;  // may be null
};

// What Work::Wait() waits for an op of limit `op_timeout`: a little slack so
// the operation's own error (naming the missing ranks) is what the caller
// sees. (Duration division is slow: computed once per scheduler for the
// default limit.)
absl::Duration WaitLimit(absl::Duration op_timeout) {
  return op_timeout + std::max(absl::Seconds(5), op_timeout / 10);
}

// A waiting thread's naps between tries (helping, polling sends): a tenth of
// the wait so far, within these bounds. A wait then lasts at most about a
// tenth longer than the operation, and a long one wakes ~1000 times a second.
const absl::Duration kMinNap = absl::Microseconds(20);
const absl::Duration kMaxNap = absl::Milliseconds(1);

class ScheduledWork : public Work {
 public:
  ScheduledWork(const char* name, uint32_t seq, absl::Duration op_timeout,
                std::shared_ptr<SchedulerLink> link, uint64_t flight_id)
      : name_(name),
        seq_(seq),
        op_timeout_(op_timeout),
        wait_limit_(link->default_timeout == op_timeout ? link->default_wait_limit
                                                        : WaitLimit(op_timeout)),
        link_(std::move(link)),
        flight_id_(flight_id) {}

  bool Poll() override {
    if (Done()) return true;
    if (link_) {
      std::unique_lock<std::mutex> hl(link_->mu, std::try_to_lock);
      if (hl.owns_lock() && link_->scheduler) link_->scheduler->MaybeWakeWorker();
    }
    return Done();
  }
  uint64_t flight_id() const { return flight_id_; }
  // Lock-free: status_ is written before done_ is released.
  bool Done() const { return done_.load(std::memory_order_acquire); }
  absl::Status Wait(absl::Duration timeout) override {
    if (Done()) return status_;
    const absl::Time start = Now();
    const absl::Time deadline = start + timeout;
    absl::Time now = start;
    for (;;) {
      if (link_) {
        // Another thread executing (a helper, the worker): nap below.
        std::unique_lock<std::mutex> ex(link_->exec_mu, std::try_to_lock);
        if (ex.owns_lock() && link_->scheduler) link_->scheduler->Help(this, deadline, now);
      }
      if (Done()) break;  // the usual end: this thread ran the op
      std::unique_lock<std::mutex> l(mu_);
      // Finish reads `waiters_` after it sets done_, this thread reads done_
      // after it counts itself in: one of them sees the other (seq_cst).
      waiters_.fetch_add(1);
      if (done_.load()) {
        waiters_.fetch_sub(1);
        break;
      }
      now = Now();
      if (now >= deadline) {
        waiters_.fetch_sub(1);
        return absl::DeadlineExceededError(
            absl::StrCat(Describe(), " did not finish within ", absl::FormatDuration(timeout),
                         " of waiting (the operation's own limit is ",
                         absl::FormatDuration(op_timeout_), " once it starts)"));
      }
      // Nothing more to do here for now: the op runs on another thread, is
      // queued behind ops that could outlast this wait (the worker runs
      // them), or is a send waiting for its receive. Sleep until it finishes
      // (Finish wakes us) or for a nap, then help and poll again.
      const absl::Duration nap = std::clamp((now - start) / 10, kMinNap, kMaxNap);
      cv_.wait_for(l, absl::ToChronoNanoseconds(std::min(deadline - now, nap)),
                   [&] { return Done(); });
      waiters_.fetch_sub(1);
      now = absl::InfinitePast();  // stale after the nap: Help reads the clock
    }
    return status_;
  }
  absl::Status Wait() override {
    if (Done()) return status_;
    return Wait(wait_limit_);
  }
  std::string Describe() const override {
    const Scheduler::Names& n = link_->names;
    return absl::StrCat(name_, " #", seq_, " in group '", n.group, "' (", n.backend,
                        " backend, rank ", n.rank, " of ", n.size, ")");
  }

  // Callers are serialized: the executor (under the exec lock), or the
  // issuing thread before the handle is returned (Reject, Push). No lock
  // unless a thread sleeps in Wait (each locked instruction counts in a
  // sub-microsecond op).
  void Finish(absl::Status status) {
    if (done_.load(std::memory_order_relaxed)) return;
    if (link_->recorder) link_->recorder->Complete(flight_id_, status.ok());
    status_ = std::move(status);
    done_.store(true);  // seq_cst: see Wait
    if (waiters_.load() > 0) {
      { std::lock_guard<std::mutex> l(mu_); }  // a waiter is asleep or will see done_
      cv_.notify_all();
    }
  }

 private:
  const char* const name_;
  const uint32_t seq_;
  const absl::Duration op_timeout_;
  const absl::Duration wait_limit_;  // of Wait()
  const std::shared_ptr<SchedulerLink> link_;
  const uint64_t flight_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> waiters_{0};  // threads in Wait that may sleep on cv_
  std::atomic<bool> done_{false};
  absl::Status status_;
};

namespace {

const absl::Duration kWorkerGrace = absl::Microseconds(200);
const absl::Duration kWorkerPeriod = absl::Milliseconds(5);
// The worker polls pending sends every kMinSendPoll at first, twice as long
// after each poll that finishes none, up to kMaxSendPoll.
const absl::Duration kMinSendPoll = absl::Microseconds(50);
const absl::Duration kMaxSendPoll = absl::Milliseconds(1);

absl::Status ShutDown(const ScheduledWork& work) {
  return absl::CancelledError(absl::StrCat(work.Describe(), ": communicator shut down"));
}

}  // namespace

std::string Scheduler::Op::Describe() const { return work->Describe(); }

Scheduler::Scheduler(std::shared_ptr<Transport> transport, Names names, absl::Duration timeout,
                     std::shared_ptr<flight::Recorder> recorder)
    : transport_(std::move(transport)), timeout_(timeout), recorder_(std::move(recorder)) {
  link_ = std::make_shared<SchedulerLink>();
  link_->scheduler = this;
  link_->names = std::move(names);
  link_->recorder = recorder_;
  link_->default_timeout = timeout_;
  link_->default_wait_limit = WaitLimit(timeout_);
  worker_ = std::thread([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() { Shutdown(); }

void Scheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  abort_flag_ = true;
  cv_.notify_all();
  {
    // Waits for the executing thread (a helper, or the worker) to end its
    // op, which the abort flag ends promptly.
    std::unique_lock<std::mutex> ex(link_->exec_mu, std::defer_lock);
    if (worker_.get_id() != std::this_thread::get_id()) ex.lock();
    std::lock_guard<std::mutex> hl(link_->mu);
    link_->scheduler = nullptr;
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

namespace {

class FunctionTask : public Scheduler::Task {
 public:
  explicit FunctionTask(std::function<absl::Status(Scheduler::Op&)> run) : run_(std::move(run)) {}
  absl::Status Run(Scheduler::Op& op) override { return run_(op); }

 private:
  std::function<absl::Status(Scheduler::Op&)> run_;
};

}  // namespace

WorkPtr Scheduler::Enqueue(const char* name, uint32_t seq, std::function<absl::Status(Op&)> run,
                           absl::Duration timeout, uint64_t flight_id) {
  return Enqueue(name, seq, std::make_shared<FunctionTask>(std::move(run)), timeout, flight_id);
}

WorkPtr Scheduler::Enqueue(const char* name, uint32_t seq, std::shared_ptr<Task> task,
                           absl::Duration timeout, uint64_t flight_id) {
  if (timeout <= absl::ZeroDuration()) timeout = timeout_;
  auto work = std::make_shared<ScheduledWork>(name, seq, timeout, link_, flight_id);
  // Not stamped here (a clock read is a tenth of a small op's cost): the op
  // is usually run by its waiter before anyone asks how long it sat queued.
  return Push(Op{std::move(work), seq, std::move(task), absl::InfinitePast(), timeout, flight_id});
}

WorkPtr Scheduler::Reject(const char* name, uint32_t seq, absl::Status error,
                          uint64_t flight_id) {
  auto work = std::make_shared<ScheduledWork>(name, seq, timeout_, link_, flight_id);
  // The abort names the op; the handle keeps the checks' own message.
  absl::Status abort(error.code(), absl::StrCat(work->Describe(), ": ", error.message()));
  work->Finish(std::move(error));
  // A marker that fails when reached in issue order (Finish is a no-op on
  // the finished handle; RunOp records the abort). It takes no time, so any
  // waiter may run it (no limit).
  return Push(Op{work, seq, std::make_shared<FunctionTask>([abort](Op&) { return abort; }),
                 Now(), absl::ZeroDuration(), flight_id});
}

WorkPtr Scheduler::Push(Op op) {
  std::shared_ptr<ScheduledWork> work = op.work;
  bool was_empty;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) {
      work->Finish(ShutDown(*work));
      return work;
    }
    was_empty = queue_.empty();
    queue_.push_back(std::move(op));
  }
  // No wake-up per op (a context switch per op costs milliseconds on a busy
  // machine): the waiting thread usually runs it. The worker is woken when an
  // op has sat unclaimed for kWorkerGrace (checked here and in Poll), and
  // looks on its own every kWorkerPeriod.
  if (!was_empty) MaybeWakeWorker();
  return work;
}

bool Scheduler::QueuedPastGrace(absl::Time now) {
  if (queue_.empty()) return false;
  absl::Time& queued = queue_.front().deadline;
  if (queued == absl::InfinitePast()) {  // first seen now (Enqueue leaves it unstamped)
    queued = now;
    return false;
  }
  return now - queued >= kWorkerGrace;
}

void Scheduler::MaybeWakeWorker() {
  bool wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    wake = QueuedPastGrace(Now());
  }
  if (wake) cv_.notify_all();
}

void Scheduler::WorkerLoop() {
  absl::Duration send_poll = kMinSendPoll;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      while (queue_.empty() && !stopping_) {
        if (num_pending_ > 0) {
          // Only polling tells when a send's receive was posted: often at
          // first, less often while none finishes (a send waiting on a slow
          // pipeline stage costs no core).
          cv_.wait_for(l, absl::ToChronoNanoseconds(send_poll));
          break;
        }
        cv_.wait_for(l, absl::ToChronoNanoseconds(kWorkerPeriod));
      }
      if (stopping_) break;
      // Grace period: a thread about to Wait on the op runs it itself (no
      // hand-off); the worker takes ops nobody picked up.
      if (!queue_.empty() && !QueuedPastGrace(Now())) {
        // Look again a grace period later (an issue or a Poll may wake us
        // sooner). The grace counts from when the op was first seen queued:
        // at most a period after its issue.
        cv_.wait_for(l, absl::ToChronoNanoseconds(kWorkerGrace));
        continue;
      }
    }
    // A thread waiting on a handle may be executing: then leave the queue
    // to it and look again shortly.
    std::unique_lock<std::mutex> ex(link_->exec_mu, std::try_to_lock);
    if (!ex.owns_lock()) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::microseconds(500));
      continue;
    }
    bool progressed = false;
    while (RunNext()) progressed = true;  // new ops may have left sends to poll
    if (PollPendingSends()) progressed = true;
    send_poll = progressed ? kMinSendPoll : std::min(2 * send_poll, kMaxSendPoll);
  }
  // Shutting down: fail what is left.
  std::lock_guard<std::mutex> ex(link_->exec_mu);
  std::deque<Op> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    left.swap(queue_);
  }
  for (Op& o : left) o.work->Finish(ShutDown(*o.work));
  for (PendingSend& p : pending_sends_) {
    transport_->Cancel(p.req.get());
    p.work->Finish(ShutDown(*p.work));
  }
  pending_sends_.clear();
  num_pending_ = 0;
}

void Scheduler::Help(ScheduledWork* work, absl::Time wait_deadline, absl::Time now) {
  // Running an op inline blocks until it ends, at worst at its own limit:
  // RunNext takes only ops that end by then before this wait does, so a
  // Wait(timeout) never lasts longer by running the ops queued before its own.
  // (`now` holds for the first op only.)
  while (!work->Done() && RunNext(wait_deadline, now)) now = absl::InfinitePast();
  PollPendingSends();  // `work` may be a send left to the background
  // Ops this wait left to the worker (still under the exec lock, which
  // keeps this scheduler alive; the waiter lets go of it right after).
  if (!work->Done()) MaybeWakeWorker();
}

bool Scheduler::RunNext(absl::Time must_end_by, absl::Time now) {
  Op op;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (queue_.empty() || stopping_) return false;
    if (now == absl::InfinitePast()) now = Now();
    if (aborted_.ok() && now + queue_.front().timeout > must_end_by) return false;
    op = std::move(queue_.front());
    queue_.pop_front();
    if (!aborted_.ok()) {
      op.work->Finish(absl::FailedPreconditionError(
          absl::StrCat(op.work->Describe(), ": not run, the communicator was aborted by an "
                                            "earlier error: ",
                       aborted_.message())));
      return true;
    }
  }
  RunOp(op, now);
  PollPendingSends();
  return true;
}

void Scheduler::RunOp(Op& op, absl::Time now) {
  op.deadline = (now == absl::InfinitePast() ? Now() : now) + op.timeout;
  if (recorder_ && !op.work->Done()) recorder_->Start(op.flight_id);  // Done: rejected
  absl::Status status = op.task->Run(op);
  // Left to the background: finishes in PollPendingSends (which holds it).
  if (op.work == nullptr) return;
  ScheduledWork* work = op.work.get();
  bool first = false;
  if (!status.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    if (aborted_.ok()) {
      aborted_ = status;
      first = true;
    }
  }
  // The dump is written before the handle reports the failure (a caller may
  // exit on it), with the op recorded as failed.
  if (first && recorder_) recorder_->Complete(op.flight_id, false);
  if (first) Aborted(status);
  work->Finish(std::move(status));
}

void Scheduler::Aborted(const absl::Status& status) {
  // A shutdown cancels ops on purpose: nothing to diagnose.
  if (recorder_ && !absl::IsCancelled(status)) recorder_->FailureDump(status);
}

void Scheduler::FinishInBackground(Op& op, std::unique_ptr<TransportReq> req, int peer) {
  pending_sends_.push_back(PendingSend{op.work, std::move(req), op.deadline, peer});
  num_pending_ = static_cast<int>(pending_sends_.size());
  op.work = nullptr;
  cv_.notify_all();  // the worker progresses it
}

bool Scheduler::PollPendingSends() {
  if (pending_sends_.empty()) return false;
  std::vector<TransportReq*> reqs;
  for (PendingSend& p : pending_sends_) reqs.push_back(p.req.get());
  transport_->Test(reqs);
  absl::Time now = Now();
  std::vector<PendingSend> keep;
  for (PendingSend& p : pending_sends_) {
    // Any thread progressing the transport may have completed the send (a
    // sibling communicator's, too): `done` is loaded with acquire before
    // `status` is read (transport.h).
    if (p.req->done.load(std::memory_order_acquire)) {
      p.work->Finish(p.req->status.ok()
                         ? absl::OkStatus()
                         : absl::Status(p.req->status.code(),
                                        absl::StrCat(p.work->Describe(), ": ",
                                                     p.req->status.message())));
    } else if (now > p.deadline) {
      transport_->Cancel(p.req.get());
      absl::Status s = absl::DeadlineExceededError(absl::StrCat(
          p.work->Describe(), " timed out after ", absl::FormatDuration(timeout_), ": rank ",
          p.peer, " did not receive the message (ranks that did not arrive: [", p.peer, "])"));
      bool first = false;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (aborted_.ok()) {
          aborted_ = s;
          first = true;
        }
      }
      if (first) {
        // (Finish records the completion too; the dump must see it first.)
        if (recorder_) recorder_->Complete(p.work->flight_id(), false);
        Aborted(s);
      }
      p.work->Finish(s);
    } else {
      keep.push_back(std::move(p));
    }
  }
  const bool finished = keep.size() < pending_sends_.size();
  pending_sends_.swap(keep);
  num_pending_ = static_cast<int>(pending_sends_.size());
  return finished;
}

}  // namespace loom::comm::internal
