#include "comm/internal/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::comm::internal {

// What a handle needs of its scheduler: a way to help or wake it while it
// exists, and the names for its description.
struct SchedulerLink {
  std::mutex mu;
  Scheduler* scheduler = nullptr;  // null once the scheduler shuts down
  Scheduler::Names names;
};

class ScheduledWork : public Work {
 public:
  ScheduledWork(const char* name, uint32_t seq, absl::Duration op_timeout,
                std::shared_ptr<SchedulerLink> link)
      : name_(name), seq_(seq), op_timeout_(op_timeout), link_(std::move(link)) {}

  bool Poll() override {
    if (Done()) return true;
    if (link_) {
      std::unique_lock<std::mutex> hl(link_->mu, std::try_to_lock);
      if (hl.owns_lock() && link_->scheduler) link_->scheduler->MaybeWakeWorker();
    }
    return Done();
  }
  // Lock-free: status_ is written before done_ is released.
  bool Done() const { return done_.load(std::memory_order_acquire); }
  absl::Status Wait(absl::Duration timeout) override {
    if (Done()) return status_;
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (Done()) break;
      bool helped = false;
      if (link_) {
        std::lock_guard<std::mutex> hl(link_->mu);
        if (link_->scheduler) helped = link_->scheduler->HelpUntil(this, deadline);
      }
      std::unique_lock<std::mutex> l(mu_);
      if (Done()) break;
      absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(Describe(), " did not finish within ", absl::FormatDuration(timeout),
                         " of waiting (the operation's own limit is ",
                         absl::FormatDuration(op_timeout_), " once it starts)"));
      }
      // Another thread is executing: wait for it (briefly, then help again).
      absl::Duration slice = std::min(deadline - now, absl::Milliseconds(helped ? 0 : 2));
      cv_.wait_for(l, absl::ToChronoNanoseconds(slice), [&] { return Done(); });
    }
    return status_;
  }
  absl::Status Wait() override {
    // A little slack so the operation's own error (naming the missing ranks)
    // is what the caller sees.
    return Wait(op_timeout_ + std::max(absl::Seconds(5), op_timeout_ / 10));
  }
  std::string Describe() const override {
    const Scheduler::Names& n = link_->names;
    return absl::StrCat(name_, " #", seq_, " in group '", n.group, "' (", n.backend,
                        " backend, rank ", n.rank, " of ", n.size, ")");
  }

  void Finish(absl::Status status) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (done_.load(std::memory_order_relaxed)) return;
      status_ = std::move(status);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  const char* const name_;
  const uint32_t seq_;
  const absl::Duration op_timeout_;
  const std::shared_ptr<SchedulerLink> link_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  absl::Status status_;
};

namespace {

const absl::Duration kWorkerGrace = absl::Microseconds(200);
const absl::Duration kWorkerPeriod = absl::Milliseconds(5);

absl::Status ShutDown(const ScheduledWork& work) {
  return absl::CancelledError(absl::StrCat(work.Describe(), ": communicator shut down"));
}

}  // namespace

std::string Scheduler::Op::Describe() const { return work->Describe(); }

Scheduler::Scheduler(std::shared_ptr<Transport> transport, Names names, absl::Duration timeout)
    : transport_(std::move(transport)), timeout_(timeout) {
  link_ = std::make_shared<SchedulerLink>();
  link_->scheduler = this;
  link_->names = std::move(names);
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
    std::lock_guard<std::mutex> hl(link_->mu);  // waits for a helping thread to stop
    link_->scheduler = nullptr;
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

WorkPtr Scheduler::Enqueue(const char* name, uint32_t seq, std::function<absl::Status(Op&)> run,
                           absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) timeout = timeout_;
  auto work = std::make_shared<ScheduledWork>(name, seq, timeout, link_);
  bool was_empty;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) {
      work->Finish(ShutDown(*work));
      return work;
    }
    was_empty = queue_.empty();
    queue_.push_back(Op{work, seq, std::move(run), absl::Now(), timeout});
  }
  // No wake-up per op (a context switch per op costs milliseconds on a busy
  // machine): the waiting thread usually runs it. The worker is woken when an
  // op has sat unclaimed for kWorkerGrace (checked here and in Poll), and
  // looks on its own every kWorkerPeriod.
  if (!was_empty) MaybeWakeWorker();
  return work;
}

void Scheduler::MaybeWakeWorker() {
  bool wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    wake = !queue_.empty() && absl::Now() - queue_.front().deadline >= kWorkerGrace;
  }
  if (wake) cv_.notify_all();
}

void Scheduler::WorkerLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      while (queue_.empty() && !stopping_) {
        if (num_pending_ > 0) {
          cv_.wait_for(l, std::chrono::microseconds(50));
          break;
        }
        cv_.wait_for(l, absl::ToChronoNanoseconds(kWorkerPeriod));
      }
      if (stopping_) break;
      // Grace period: a thread about to Wait on the op runs it itself (no
      // hand-off); the worker takes ops nobody picked up.
      if (!queue_.empty()) {
        absl::Duration age = absl::Now() - queue_.front().deadline;
        if (age < kWorkerGrace) {
          cv_.wait_for(l, absl::ToChronoNanoseconds(std::max(kWorkerGrace - age, kWorkerPeriod)));
          continue;
        }
      }
    }
    // A thread waiting on a handle may be executing: then leave the queue
    // to it and look again shortly.
    std::unique_lock<std::mutex> ex(exec_mu_, std::try_to_lock);
    if (!ex.owns_lock()) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::microseconds(500));
      continue;
    }
    while (RunNext()) {
    }
    PollPendingSends(true);
  }
  // Shutting down: fail what is left.
  std::lock_guard<std::mutex> ex(exec_mu_);
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

bool Scheduler::HelpUntil(ScheduledWork* work, absl::Time wait_deadline) {
  // Running an op inline blocks until the op ends (or its own deadline): only
  // do it when this wait would last that long anyway.
  if (wait_deadline < absl::Now() + timeout_) return false;
  std::unique_lock<std::mutex> ex(exec_mu_, std::try_to_lock);
  if (!ex.owns_lock()) return false;
  while (!work->Done() && RunNext()) {
  }
  return true;
}

bool Scheduler::RunNext() {
  Op op;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (queue_.empty() || stopping_) return false;
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
  RunOp(op);
  PollPendingSends(false);
  return true;
}

void Scheduler::RunOp(Op& op) {
  op.deadline = absl::Now() + op.timeout;
  std::shared_ptr<ScheduledWork> work = op.work;
  absl::Status status = op.run(op);
  if (op.work == nullptr) return;  // left to the background: finishes in PollPendingSends
  if (!status.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    if (aborted_.ok()) aborted_ = status;
  }
  work->Finish(status);
}

void Scheduler::FinishInBackground(Op& op, std::unique_ptr<TransportReq> req, int peer) {
  pending_sends_.push_back(PendingSend{op.work, std::move(req), op.deadline, peer});
  num_pending_ = static_cast<int>(pending_sends_.size());
  op.work = nullptr;
  cv_.notify_all();  // the worker progresses it
}

void Scheduler::PollPendingSends(bool force_deadline_check) {
  if (pending_sends_.empty()) return;
  std::vector<TransportReq*> reqs;
  for (PendingSend& p : pending_sends_) reqs.push_back(p.req.get());
  transport_->Test(reqs);
  absl::Time now = absl::Now();
  std::vector<PendingSend> keep;
  for (PendingSend& p : pending_sends_) {
    if (p.req->done) {
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
      {
        std::lock_guard<std::mutex> l(mu_);
        if (aborted_.ok()) aborted_ = s;
      }
      p.work->Finish(s);
    } else {
      keep.push_back(std::move(p));
    }
  }
  pending_sends_.swap(keep);
  num_pending_ = static_cast<int>(pending_sends_.size());
}

}  // namespace loom::comm::internal
