#include "comm/internal/engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/internal/checks.h"
#include "comm/internal/reduce.h"
#include "core/dtype.h"

namespace loom::comm::internal {

struct EngineHelper {
  std::mutex mu;
  Engine* engine = nullptr;  // null once the engine shuts down
  // For descriptions (built only when needed: errors).
  std::string group;
  const char* backend;
  int rank, size;
};

class EngineWork : public Work {
 public:
  EngineWork(const char* name, uint32_t seq, absl::Duration op_timeout,
             std::shared_ptr<EngineHelper> helper)
      : name_(name), seq_(seq), op_timeout_(op_timeout), helper_(std::move(helper)) {}

  bool Poll() override {
    if (Done()) return true;
    if (helper_) {
      std::unique_lock<std::mutex> hl(helper_->mu, std::try_to_lock);
      if (hl.owns_lock() && helper_->engine) helper_->engine->MaybeWakeWorker();
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
      if (helper_) {
        std::lock_guard<std::mutex> hl(helper_->mu);
        if (helper_->engine) helped = helper_->engine->HelpUntil(this, deadline);
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
    return absl::StrCat(name_, " #", seq_, " in group '", helper_->group, "' (", helper_->backend,
                        " backend, rank ", helper_->rank, " of ", helper_->size, ")");
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
  const std::shared_ptr<EngineHelper> helper_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  absl::Status status_;
};

namespace {

enum OpKind : uint32_t {
  kAllReduce = 1, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllToAll, kP2P, kBarrier
};

uint32_t Sig(uint32_t kind, core::DType dtype, int64_t count, int64_t extra) {
  uint64_t x = (uint64_t{kind} << 56) ^ (uint64_t{static_cast<uint8_t>(dtype)} << 48) ^
               static_cast<uint64_t>(count) * 0x9e3779b97f4a7c15ull ^
               static_cast<uint64_t>(extra + 7) * 0xc2b2ae3d27d4eb4full;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x & kSigMask);
}

char* P(const core::Tensor& t) { return static_cast<char*>(t.raw_data()); }
int Mod(int a, int n) { return ((a % n) + n) % n; }
int Ctz(int x) { return __builtin_ctz(static_cast<unsigned>(x)); }
char g_empty = 0;

bool IsPow2(int n) { return (n & (n - 1)) == 0; }
const absl::Duration kWorkerGrace = absl::Microseconds(200);
const absl::Duration kWorkerPeriod = absl::Milliseconds(5);

}  // namespace

Engine::Engine(std::shared_ptr<Transport> transport, std::vector<int> members, uint32_t ctx,
               EngineOptions options, const char* backend_name)
    : transport_(std::move(transport)),
      members_(std::move(members)),
      ctx_(ctx),
      options_(std::move(options)),
      backend_name_(backend_name) {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] == transport_->rank()) rank_ = static_cast<int>(i);
  }
  helper_ = std::make_shared<EngineHelper>();
  helper_->engine = this;
  helper_->group = options_.comm.group_name;
  helper_->backend = backend_name_;
  helper_->rank = rank_;
  helper_->size = static_cast<int>(members_.size());
  worker_ = std::thread([this] { WorkerLoop(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  abort_flag_ = true;
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> hl(helper_->mu);  // waits for a helping thread to stop
    helper_->engine = nullptr;
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

WorkPtr Engine::Fail(const char* name, absl::Status status) {
  return CompletedWork(std::move(status), absl::StrCat(name, " in group '", group_name(), "'"));
}

WorkPtr Engine::Enqueue(const char* name, uint32_t sig, std::function<absl::Status(Op&)> run,
                        bool point_to_point, absl::Duration timeout) {
  uint32_t seq = point_to_point ? next_p2p_seq_++ : next_seq_++;
  if (timeout <= absl::ZeroDuration()) timeout = options_.comm.timeout;
  auto work = std::make_shared<EngineWork>(name, seq, timeout, helper_);
  bool was_empty;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) {
      work->Finish(absl::CancelledError(absl::StrCat(work->Describe(), ": communicator shut down")));
      return work;
    }
    was_empty = queue_.empty();
    queue_.push_back(Op{work, seq, std::move(run), absl::Now(), sig, timeout});
  }
  // No wake-up per op (a context switch per op costs milliseconds on a busy
  // machine): the waiting thread usually runs it. The worker is woken when an
  // op has sat unclaimed for kWorkerGrace (checked here and in Poll), and
  // looks on its own every kWorkerPeriod.
  if (!was_empty) MaybeWakeWorker();
  return work;
}

void Engine::MaybeWakeWorker() {
  bool wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    wake = !queue_.empty() && absl::Now() - queue_.front().deadline >= kWorkerGrace;
  }
  if (wake) cv_.notify_all();
}

void Engine::WorkerLoop() {
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
  for (Op& o : left) {
    o.work->Finish(absl::CancelledError(absl::StrCat(o.work->Describe(), ": communicator shut down")));
  }
  for (PendingSend& p : pending_sends_) {
    transport_->Cancel(p.req.get());
    p.work->Finish(absl::CancelledError(absl::StrCat(p.work->Describe(), ": communicator shut down")));
  }
  pending_sends_.clear();
  num_pending_ = 0;
}

bool Engine::HelpUntil(EngineWork* work, absl::Time wait_deadline) {
  // Running an op inline blocks until the op ends (or its own deadline): only
  // do it when this wait would last that long anyway.
  if (wait_deadline < absl::Now() + options_.comm.timeout) return false;
  std::unique_lock<std::mutex> ex(exec_mu_, std::try_to_lock);
  if (!ex.owns_lock()) return false;
  while (!work->Done() && RunNext()) {
  }
  return true;
}

bool Engine::RunNext() {
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

void Engine::RunOp(Op& op) {
  op.deadline = absl::Now() + op.timeout;
  std::shared_ptr<EngineWork> work = op.work;
  absl::Status status = op.run(op);
  if (op.work == nullptr) return;  // a Send: finishes in PollPendingSends
  if (!status.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    if (aborted_.ok()) aborted_ = status;
  }
  work->Finish(status);
}

void Engine::PollPendingSends(bool force_deadline_check) {
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
          p.work->Describe(), " timed out after ", absl::FormatDuration(options_.comm.timeout),
          ": rank ", p.peer, " did not receive the message (ranks that did not arrive: [",
          p.peer, "])"));
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

char* Engine::Stage(int i, size_t bytes) {
  if (stage_[i].size() < bytes) stage_[i].resize(bytes);
  return stage_[i].empty() ? &g_empty : stage_[i].data();
}

absl::Status Engine::Exchange(Op& op, absl::Span<const Leg> legs) {
  absl::InlinedVector<TransportReq, 4> reqs(legs.size());
  std::vector<TransportReq*>& ptrs = exchange_ptrs_;  // reused: no allocation per call
  ptrs.clear();
  const int me = transport_->rank();
  // Receives are posted before sends: a peer's message then finds its
  // buffer waiting instead of being staged as unexpected (a copy, and for
  // large messages a slower rendezvous path).
  for (size_t k = 0; k < 2 * legs.size(); ++k) {
    const size_t i = k % legs.size();
    const Leg& leg = legs[i];
    if (leg.is_send != (k >= legs.size())) continue;
    TransportReq& r = reqs[i];
    r.is_send = leg.is_send;
    r.peer = members_[leg.peer];
    uint32_t payload = ((op.seq & 0x1fffu) << 6) | (static_cast<uint32_t>(leg.step) & 63u);
    r.tag = MakeTag(ctx_, leg.is_send ? me : r.peer, false, payload, op.sig);
    r.buf = leg.bytes ? leg.buf : &g_empty;
    r.bytes = leg.bytes;
    transport_->Post(&r);
  }
  for (TransportReq& r : reqs) ptrs.push_back(&r);
  absl::Status s = transport_->WaitAll(ptrs, op.deadline, abort_flag_);
  if (absl::IsDeadlineExceeded(s)) {
    std::vector<int> missing;
    for (size_t i = 0; i < legs.size(); ++i) {
      if (!reqs[i].done) missing.push_back(legs[i].peer);
    }
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    return absl::DeadlineExceededError(
        absl::StrCat(op.work->Describe(), " timed out after ",
                     absl::FormatDuration(op.timeout), ": ranks that did not arrive: [",
                     absl::StrJoin(missing, ", "), "]"));
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(op.work->Describe(), ": ", s.message()));
  }
  for (size_t i = 0; i < legs.size(); ++i) {
    if (!reqs[i].status.ok()) {
      return absl::Status(reqs[i].status.code(),
                          absl::StrCat(op.work->Describe(), ": ",
                                       legs[i].is_send ? "send to" : "receive from", " rank ",
                                       legs[i].peer, ": ", reqs[i].status.message()));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- all-reduce

WorkPtr Engine::AllReduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op) {
  absl::Status s = CheckAllReduce(input, output);
  if (!s.ok()) return Fail("all_reduce", s);
  return Enqueue("all_reduce", Sig(kAllReduce, input.dtype(), input.numel(), static_cast<int>(op)),
                 [this, input, output, op](Op& o) { return RunAllReduce(o, input, output, op); });
}

absl::Status Engine::RunAllReduce(Op& op, const core::Tensor& in, const core::Tensor& out,
                                  ReduceOp red) {
  const core::DType dt = in.dtype();
  const size_t es = core::DTypeSize(dt);
  const int64_t count = in.numel();
  const size_t bytes = in.nbytes();
  char* dst = P(out);
  const char* src = P(in);
  const int n = size();
  const int r = rank_;
  absl::Status s;
  if (n == 1 || bytes <= options_.small_bytes || count < n) {
    if (src != dst) std::memcpy(dst, src, bytes);
    if (n == 1 || count == 0) return absl::OkStatus();
    if (IsPow2(n)) {
      char* rb = Stage(0, bytes);
      for (int mask = 1; mask < n; mask <<= 1) {
        int partner = r ^ mask;
        s = Exchange(op, {{true, partner, Ctz(mask), dst, bytes}, {false, partner, Ctz(mask), rb, bytes}});
        if (!s.ok()) return s;
        ReduceInto(dst, rb, count, dt, red);
      }
    } else {
      char* all = Stage(0, bytes * n);
      std::memcpy(all + r * bytes, dst, bytes);
      std::vector<Leg> legs;
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        legs.push_back({true, j, 0, dst, bytes});
        legs.push_back({false, j, 0, all + j * bytes, bytes});
      }
      s = Exchange(op, legs);
      if (!s.ok()) return s;
      std::memcpy(dst, all, bytes);
      for (int j = 1; j < n; ++j) ReduceInto(dst, all + j * bytes, count, dt, red);
    }
  } else {
    auto blk = [&](int b) {
      b = Mod(b, n);
      int64_t start = b * count / n, end = (b + 1) * count / n;
      return std::make_pair(start, end - start);
    };
    const int right = Mod(r + 1, n), left = Mod(r - 1, n);
    char* rb = Stage(0, (count / n + 1) * es);
    // Out of place, the input is never copied to the output: the first step
    // sends straight from the input, and every received block is reduced
    // from input + received into the output (the same operand order as in
    // place, so results stay bitwise identical). The one block this rank
    // only sends is filled by the all-gather.
    for (int st = 0; st < n - 1; ++st) {
      auto sb = blk(r - st - 1), rbk = blk(r - st - 2);
      const char* send_from = st == 0 ? src : dst;
      std::vector<Leg> legs;
      if (sb.second) {
        legs.push_back({true, right, st, const_cast<char*>(send_from) + sb.first * es,
                        sb.second * es});
      }
      if (rbk.second) legs.push_back({false, left, st, rb, rbk.second * es});
      s = Exchange(op, legs);
      if (!s.ok()) return s;
      if (rbk.second) {
        ReduceTo(dst + rbk.first * es, src + rbk.first * es, rb, rbk.second, dt, red);
      }
    }
    if (red == ReduceOp::kAvg) {
      auto own = blk(r);
      FinishAvg(dst + own.first * es, own.second, dt, n);
    }
    for (int st = 0; st < n - 1; ++st) {
      auto sb = blk(r - st), rbk = blk(r - st - 1);
      std::vector<Leg> legs;
      if (sb.second) legs.push_back({true, right, n + st, dst + sb.first * es, sb.second * es});
      if (rbk.second) legs.push_back({false, left, n + st, dst + rbk.first * es, rbk.second * es});
      s = Exchange(op, legs);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (red == ReduceOp::kAvg) FinishAvg(dst, count, dt, n);
  return absl::OkStatus();
}

// ----------------------------------------------------------------- broadcast

WorkPtr Engine::Broadcast(const core::Tensor& input, const core::Tensor& output, int root) {
  absl::Status s = CheckBroadcast(input, output, root, size());
  if (!s.ok()) return Fail("broadcast", s);
  return Enqueue("broadcast", Sig(kBroadcast, input.dtype(), input.numel(), root),
                 [this, input, output, root](Op& o) { return RunBroadcast(o, input, output, root); });
}

absl::Status Engine::RunBroadcast(Op& op, const core::Tensor& in, const core::Tensor& out,
                                  int root) {
  const int n = size(), r = rank_;
  const size_t bytes = out.nbytes();
  if (r == root && P(in) != P(out)) std::memcpy(P(out), P(in), bytes);
  if (n == 1 || bytes == 0) return absl::OkStatus();
  const int vr = Mod(r - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      absl::Status s = Exchange(op, {{false, Mod(vr - mask + root, n), Ctz(mask), P(out), bytes}});
      if (!s.ok()) return s;
      break;
    }
    mask <<= 1;
  }
  std::vector<Leg> legs;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) legs.push_back({true, Mod(vr + mask + root, n), Ctz(mask), P(out), bytes});
  }
  return legs.empty() ? absl::OkStatus() : Exchange(op, legs);
}

// -------------------------------------------------------------------- reduce

WorkPtr Engine::Reduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op,
                       int root) {
  absl::Status s = CheckReduce(input, output, root, size());
  if (!s.ok()) return Fail("reduce", s);
  return Enqueue("reduce",
                 Sig(kReduce, input.dtype(), input.numel(), root * 8 + static_cast<int>(op)),
                 [this, input, output, op, root](Op& o) {
                   return RunReduce(o, input, output, op, root);
                 });
}

absl::Status Engine::RunReduce(Op& op, const core::Tensor& in, const core::Tensor& out,
                               ReduceOp red, int root) {
  const int n = size(), r = rank_;
  const size_t bytes = in.nbytes();
  const int64_t count = in.numel();
  if (bytes == 0) return absl::OkStatus();
  char* acc = r == root ? P(out) : Stage(0, bytes);
  if (acc != P(in)) std::memcpy(acc, P(in), bytes);
  if (n == 1) return absl::OkStatus();
  char* rb = Stage(1, bytes);
  const int vr = Mod(r - root, n);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      return Exchange(op, {{true, Mod(vr - mask + root, n), Ctz(mask), acc, bytes}});
    }
    if (vr + mask < n) {
      absl::Status s = Exchange(op, {{false, Mod(vr + mask + root, n), Ctz(mask), rb, bytes}});
      if (!s.ok()) return s;
      ReduceInto(acc, rb, count, in.dtype(), red);
    }
  }
  if (red == ReduceOp::kAvg) FinishAvg(acc, count, in.dtype(), n);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- all-gather

WorkPtr Engine::AllGather(const core::Tensor& input, const core::Tensor& output) {
  absl::Status s = CheckAllGather(input, output, rank_, size());
  if (!s.ok()) return Fail("all_gather", s);
  return Enqueue("all_gather", Sig(kAllGather, input.dtype(), input.numel(), 0),
                 [this, input, output](Op& o) { return RunAllGather(o, input, output); });
}

absl::Status Engine::RunAllGather(Op& op, const core::Tensor& in, const core::Tensor& out) {
  const int n = size(), r = rank_;
  const size_t mb = in.nbytes();
  char* o = P(out);
  if (o + r * mb != P(in)) std::memcpy(o + r * mb, P(in), mb);
  if (n == 1 || mb == 0) return absl::OkStatus();
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  for (int st = 0; st < n - 1; ++st) {
    absl::Status s = Exchange(op, {{true, right, st, o + Mod(r - st, n) * mb, mb},
                                   {false, left, st, o + Mod(r - st - 1, n) * mb, mb}});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ reduce-scatter

WorkPtr Engine::ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                              ReduceOp op) {
  absl::Status s = CheckReduceScatter(input, output, rank_, size());
  if (!s.ok()) return Fail("reduce_scatter", s);
  return Enqueue("reduce_scatter",
                 Sig(kReduceScatter, input.dtype(), output.numel(), static_cast<int>(op)),
                 [this, input, output, op](Op& o) { return RunReduceScatter(o, input, output, op); });
}

absl::Status Engine::RunReduceScatter(Op& op, const core::Tensor& in, const core::Tensor& out,
                                      ReduceOp red) {
  const int n = size(), r = rank_;
  const int64_t m = out.numel();
  const size_t mb = out.nbytes();
  const core::DType dt = in.dtype();
  char* src = P(in);
  if (n == 1) {
    if (P(out) != src) std::memcpy(P(out), src, mb);
    return absl::OkStatus();
  }
  if (m == 0) return absl::OkStatus();
  char* acc = Stage(0, mb);
  char* rb = Stage(1, mb);
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  for (int st = 0; st < n - 1; ++st) {
    const int sb = Mod(r - st - 1, n), rbk = Mod(r - st - 2, n);
    char* send = st == 0 ? src + sb * mb : acc;
    absl::Status s = Exchange(op, {{true, right, st, send, mb}, {false, left, st, rb, mb}});
    if (!s.ok()) return s;
    char* target = st == n - 2 ? P(out) : acc;
    if (target != src + rbk * mb) std::memcpy(target, src + rbk * mb, mb);
    ReduceInto(target, rb, m, dt, red);
  }
  if (red == ReduceOp::kAvg) FinishAvg(P(out), m, dt, n);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- all-to-all

WorkPtr Engine::AllToAll(const core::Tensor& input, const core::Tensor& output) {
  absl::Status s = CheckAllToAll(input, output, size());
  if (!s.ok()) return Fail("all_to_all", s);
  return Enqueue("all_to_all", Sig(kAllToAll, input.dtype(), input.numel(), 0),
                 [this, input, output](Op& o) { return RunAllToAll(o, input, output); });
}

absl::Status Engine::RunAllToAll(Op& op, const core::Tensor& in, const core::Tensor& out) {
  const int n = size(), r = rank_;
  const size_t bytes = in.nbytes(), mb = bytes / n;
  const char* src = P(in);
  if (src == P(out) && n > 1) {
    char* tmp = Stage(0, bytes);
    std::memcpy(tmp, src, bytes);
    src = tmp;
  }
  char* o = P(out);
  if (o + r * mb != src + r * mb) std::memcpy(o + r * mb, src + r * mb, mb);
  if (n == 1 || mb == 0) return absl::OkStatus();
  std::vector<Leg> legs;
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    legs.push_back({true, j, 0, const_cast<char*>(src) + j * mb, mb});
    legs.push_back({false, j, 0, o + j * mb, mb});
  }
  return Exchange(op, legs);
}

// ------------------------------------------------------------------- barrier

WorkPtr Engine::Barrier() { return BarrierWithin(absl::ZeroDuration()); }

WorkPtr Engine::BarrierWithin(absl::Duration op_timeout) {
  return Enqueue("barrier", Sig(kBarrier, core::DType::kU8, 0, 0),
                 [this](Op& o) { return RunBarrier(o); }, false, op_timeout);
}

absl::Status Engine::RunBarrier(Op& op) {
  const int n = size(), r = rank_;
  for (int k = 1, st = 0; k < n; k <<= 1, ++st) {
    absl::Status s = Exchange(op, {{true, Mod(r + k, n), st, nullptr, 0},
                                   {false, Mod(r - k, n), st, nullptr, 0}});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ point to point

absl::Status Engine::P2P(Op& op, const std::vector<P2POp>& ops, bool wait_sends) {
  std::vector<std::unique_ptr<TransportReq>> reqs;
  std::vector<TransportReq*> ptrs;
  const int me = transport_->rank();
  for (const P2POp& p : ops) {
    auto r = std::make_unique<TransportReq>();
    r->is_send = p.kind == P2POp::Kind::kSend;
    r->peer = members_[p.peer];
    r->tag = MakeTag(ctx_, r->is_send ? me : r->peer, true, static_cast<uint32_t>(p.tag),
                     Sig(kP2P, p.tensor.dtype(), p.tensor.numel(), 0));
    r->bytes = p.tensor.nbytes();
    r->buf = r->bytes ? p.tensor.raw_data() : &g_empty;
    transport_->Post(r.get());
    ptrs.push_back(r.get());
    reqs.push_back(std::move(r));
  }
  if (!wait_sends) {  // a single Send: completes in the background
    pending_sends_.push_back(
        PendingSend{op.work, std::move(reqs[0]), op.deadline, ops[0].peer});
    num_pending_ = static_cast<int>(pending_sends_.size());
    op.work = nullptr;
    cv_.notify_all();  // the worker progresses it
    return absl::OkStatus();
  }
  absl::Status s = transport_->WaitAll(ptrs, op.deadline, abort_flag_);
  if (absl::IsDeadlineExceeded(s)) {
    std::vector<int> missing;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!reqs[i]->done) missing.push_back(ops[i].peer);
    }
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    return absl::DeadlineExceededError(
        absl::StrCat(op.work->Describe(), " timed out after ",
                     absl::FormatDuration(op.timeout), ": ranks that did not arrive: [",
                     absl::StrJoin(missing, ", "), "]"));
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(op.work->Describe(), ": ", s.message()));
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!reqs[i]->status.ok()) {
      return absl::Status(
          reqs[i]->status.code(),
          absl::StrCat(op.work->Describe(), ": ", reqs[i]->is_send ? "send to" : "receive from",
                       " rank ", ops[i].peer, " (tag ", ops[i].tag, "): ",
                       reqs[i]->status.message()));
    }
  }
  return absl::OkStatus();
}

WorkPtr Engine::Send(const core::Tensor& tensor, int peer, int tag) {
  absl::Status s = CheckP2P("send", tensor, peer, tag, rank_, size());
  if (!s.ok()) return Fail("send", s);
  std::vector<P2POp> ops = {{P2POp::Kind::kSend, tensor, peer, tag}};
  return Enqueue("send", 0, [this, ops](Op& o) { return P2P(o, ops, false); }, true);
}

WorkPtr Engine::Recv(const core::Tensor& tensor, int peer, int tag) {
  absl::Status s = CheckP2P("recv", tensor, peer, tag, rank_, size());
  if (!s.ok()) return Fail("recv", s);
  std::vector<P2POp> ops = {{P2POp::Kind::kRecv, tensor, peer, tag}};
  return Enqueue("recv", 0, [this, ops](Op& o) { return P2P(o, ops, true); }, true);
}

WorkPtr Engine::BatchSendRecv(const std::vector<P2POp>& ops) {
  absl::Status s = CheckBatch(ops, rank_, size());
  if (!s.ok()) return Fail("batch_send_recv", s);
  if (ops.empty()) return CompletedWork(absl::OkStatus(), "batch_send_recv (empty)");
  return Enqueue("batch_send_recv", 0, [this, ops](Op& o) { return P2P(o, ops, true); },
                 true);
}

// --------------------------------------------------------------------- split

absl::StatusOr<std::unique_ptr<Communicator>> Engine::Split(int color, int key,
                                                            const std::string& name) {
  const int n = size();
  auto in = core::Tensor::Empty({3}, core::DType::kI32);
  auto out = core::Tensor::Empty({3 * static_cast<int64_t>(n)}, core::DType::kI32);
  if (!in.ok()) return in.status();
  if (!out.ok()) return out.status();
  int32_t* mine = in->data<int32_t>();
  mine[0] = color < 0 ? -1 : color;
  mine[1] = key;
  mine[2] = static_cast<int32_t>(transport_->next_ctx.load());
  absl::Status s = AllGather(*in, *out)->Wait();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("split of group '", group_name(), "' into '", name,
                                               "': ", s.message()));
  }
  const int32_t* all = out->data<int32_t>();
  uint32_t base = 0;
  std::map<int, int> color_index;
  for (int j = 0; j < n; ++j) {
    base = std::max(base, static_cast<uint32_t>(all[3 * j + 2]));
    if (all[3 * j] >= 0) color_index.emplace(all[3 * j], 0);
  }
  int idx = 0;
  for (auto& [c, i] : color_index) i = idx++;
  uint32_t next = base + static_cast<uint32_t>(color_index.size());
  uint32_t cur = transport_->next_ctx.load();
  while (cur < next && !transport_->next_ctx.compare_exchange_weak(cur, next)) {
  }
  if (color < 0) return std::unique_ptr<Communicator>();
  if (base + color_index[color] >= static_cast<uint32_t>(kMaxContexts)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "split of group '", group_name(), "': more than ", kMaxContexts,
        " communicators created over this endpoint; create groups once and reuse them"));
  }
  std::vector<std::pair<std::pair<int, int>, int>> chosen;  // ((key, old rank), transport rank)
  for (int j = 0; j < n; ++j) {
    if (all[3 * j] == color) chosen.push_back({{all[3 * j + 1], j}, members_[j]});
  }
  std::sort(chosen.begin(), chosen.end());
  std::vector<int> members;
  for (auto& c : chosen) members.push_back(c.second);
  EngineOptions child = options_;
  child.comm.group_name = name;
  return std::unique_ptr<Communicator>(
      new Engine(transport_, std::move(members), base + color_index[color], child, backend_name_));
}

}  // namespace loom::comm::internal
