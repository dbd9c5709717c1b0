#include "comm/internal/engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/internal/checks.h"
#include "core/dtype.h"

namespace loom::comm::internal {

namespace {

enum OpKind : uint32_t {
  kAllReduce = 1, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllToAll, kP2P, kBarrier,
  kAllToAllV
};

// The signature a receiver checks: a hash of the call (op, dtype, count and
// the op's own argument: reduce op, root).
uint32_t Sig(uint32_t kind, core::DType dtype, int64_t count, int64_t extra) {
  uint64_t x = (uint64_t{kind} << 56) ^ (uint64_t{static_cast<uint8_t>(dtype)} << 48) ^
               static_cast<uint64_t>(count) * 0x9e3779b97f4a7c15ull ^
               static_cast<uint64_t>(extra + 7) * 0xc2b2ae3d27d4eb4full;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x & kSigMask);
}

char g_empty = 0;

// Waits for the requests of `op` until its deadline. Errors name the op and,
// on a timeout, the group ranks of the legs not done (`peer(i)` of leg i), or
// the leg that failed (`leg(i)`: "send to rank 3"). A wait that fails
// (timeout, shutdown) cancels every request not done, handing the transport
// `keep()`: what owns their buffers (transport.h, Cancel). The caller may
// then free the requests and let go of its tensors: the transport cannot
// cancel a send or a receive whose message is arriving, and may touch those
// buffers later, whatever this op's status says (comm.h, FAILURE).
template <typename Peer, typename LegName, typename Keep>
absl::Status WaitLegs(Transport& transport, const Scheduler::Op& op,
                      const std::vector<TransportReq*>& reqs, const std::atomic<bool>& abort,
                      Peer peer, LegName leg, Keep keep) {
  absl::Status s = transport.WaitAll(reqs, op.deadline, abort);
  std::vector<int> missing;
  if (!s.ok()) {
    std::shared_ptr<const void> held;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i]->done.load(std::memory_order_acquire)) continue;
      missing.push_back(peer(i));
      if (!held) held = keep();
      reqs[i]->keep_alive = held;
      transport.Cancel(reqs[i]);
    }
  }
  if (absl::IsDeadlineExceeded(s)) {
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    return absl::DeadlineExceededError(
        absl::StrCat(op.Describe(), " timed out after ", absl::FormatDuration(op.timeout),
                     ": ranks that did not arrive: [", absl::StrJoin(missing, ", "), "]"));
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(op.Describe(), ": ", s.message()));
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!reqs[i]->status.ok()) {
      return absl::Status(reqs[i]->status.code(), absl::StrCat(op.Describe(), ": ", leg(i), ": ",
                                                              reqs[i]->status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// The context ids of one transport endpoint, shared by every Engine over
// it, and the Splits choosing new ones. Ids are never reused here. A Split's
// members each propose the lowest id free here; the groups get consecutive
// ids from the largest proposal on, and each member claims its group's id.
// A concurrent Split of another communicator over this endpoint may have
// chosen the same id meanwhile: then a claim fails (the id is taken or
// claimed), and all members try again with new proposals. Claims are held
// only until every member has voted, so nothing waits on another Split.
class ContextIds {
 public:
  explicit ContextIds(uint32_t root) : next_(std::max<uint32_t>(root + 1, 2)) {}

  // The lowest id neither taken nor claimed here.
  uint32_t Proposal() {
    std::lock_guard<std::mutex> l(mu_);
    return claimed_.empty() ? next_ : std::max(next_, *claimed_.rbegin() + 1);
  }
  bool TryClaim(uint32_t id) {
    std::lock_guard<std::mutex> l(mu_);
    return id >= next_ && claimed_.insert(id).second;
  }
  void Release(uint32_t id) {
    std::lock_guard<std::mutex> l(mu_);
    claimed_.erase(id);
  }
  void Take(uint32_t id) {
    std::lock_guard<std::mutex> l(mu_);
    claimed_.erase(id);
    next_ = std::max(next_, id + 1);
  }

 private:
  std::mutex mu_;
  uint32_t next_;               // ids below are taken, or skipped (never used)
  std::set<uint32_t> claimed_;  // by Splits in flight
};

// One collective of this engine as the algorithms see it: its steps become
// messages tagged with the op's sequence number and signature.
// `op.task` owns the op's tensors.
class Engine::OpSteps : public Steps {
 public:
  OpSteps(Engine* engine, Op* op, uint32_t sig) : engine_(engine), op_(op), sig_(sig) {}
  int rank() const override { return engine_->rank_; }
  int size() const override { return engine_->size(); }
  absl::Status Exchange(absl::Span<const Leg> legs) override {
    return engine_->Exchange(*op_, sig_, legs);
  }
  char* Stage(int i, size_t bytes) override { return engine_->Stage(i, bytes); }

 private:
  Engine* const engine_;
  Op* const op_;
  const uint32_t sig_;
};

// A collective as the scheduler's task: the algorithm with its arguments
// (the op's tensors) in one allocation, which a request the op gives up
// keeps alive after the op (Exchange).
template <typename Algorithm>
class Engine::CollectiveTask : public Scheduler::Task {
 public:
  CollectiveTask(Engine* engine, uint32_t sig, Algorithm run)
      : engine_(engine), sig_(sig), run_(std::move(run)) {}
  absl::Status Run(Op& op) override {
    OpSteps steps(engine_, &op, sig_);
    return run_(steps);
  }

 private:
  Engine* const engine_;
  const uint32_t sig_;
  const Algorithm run_;
};

Engine::Engine(std::shared_ptr<Transport> transport, std::vector<int> members, uint32_t ctx,
               EngineOptions options, const char* backend_name)
    : Engine(std::move(transport), std::move(members), ctx, std::move(options), backend_name,
             std::make_shared<ContextIds>(ctx)) {}

Engine::Engine(std::shared_ptr<Transport> transport, std::vector<int> members, uint32_t ctx,
               EngineOptions options, const char* backend_name,
               std::shared_ptr<ContextIds> contexts)
    : transport_(std::move(transport)),
      contexts_(std::move(contexts)),
      members_(std::move(members)),
      ctx_(ctx),
      options_(std::move(options)),
      backend_name_(backend_name) {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] == transport_->rank()) rank_ = static_cast<int>(i);
  }
  // Transport ranks are world ranks (the root engine spans the endpoint's world).
  flight::CommInfo fi;
  fi.group = options_.comm.group_name;
  fi.backend = backend_name_;
  fi.world_rank = transport_->rank();
  fi.group_rank = rank_;
  fi.group_size = static_cast<int>(members_.size());
  fi.members = members_;
  fi.entries = options_.comm.flight_recorder_entries;
  fi.dir = options_.comm.flight_recorder_dir;
  recorder_ = flight::Recorder::Create(std::move(fi));
  scheduler_ = std::make_unique<Scheduler>(
      transport_,
      Scheduler::Names{options_.comm.group_name, backend_name_, rank_,
                       static_cast<int>(members_.size())},
      options_.comm.timeout, recorder_);
}

Engine::~Engine() {
  Shutdown();
  ChargeStaging(0, 0);
  ChargeStaging(1, 0);
}

void Engine::ChargeStaging(int i, size_t bytes) {
  const int64_t delta = static_cast<int64_t>(bytes) - static_cast<int64_t>(staged_bytes_[i]);
  constexpr auto kComm = core::MemoryCategory::kCommunication;
  if (delta > 0) ledger_->Allocated(core::DeviceType::kCPU, kComm, delta);
  if (delta < 0) ledger_->Freed(core::DeviceType::kCPU, kComm, -delta);
  staged_bytes_[i] = bytes;
}

void Engine::Shutdown() { scheduler_->Shutdown(); }

WorkPtr Engine::Fail(const char* name, flight::OpKind kind, const core::Tensor& tensor,
                     uint32_t& sequence, absl::Status status) {
  const uint64_t id = recorder_->Issue(kind, sequence, tensor.dtype(), tensor.nbytes());
  return scheduler_->Reject(name, sequence++, std::move(status), id);
}

// `run` captures the op's tensors by init-capture (`[in = input]`): a plain
// copy-capture of a `const Tensor&` parameter is a const member, which every
// move of the closure on its way into the task copies (a reference count
// each, 8 locked instructions per all-reduce).
template <typename Run>
WorkPtr Engine::Collective(const char* name, flight::OpKind kind, core::DType dtype,
                           uint64_t bytes, int root, uint32_t sig, Run run,
                           absl::Duration timeout) {
  const uint64_t id = recorder_->Issue(kind, next_seq_, dtype, bytes, root);
  return scheduler_->Enqueue(name, next_seq_++,
                             std::make_shared<CollectiveTask<Run>>(this, sig, std::move(run)),
                             timeout, id);
}

WorkPtr Engine::PointToPoint(const char* name, flight::OpKind kind, std::vector<P2POp> ops,
                             bool wait_sends) {
  uint64_t bytes = 0;
  for (const P2POp& p : ops) bytes += p.tensor.nbytes();
  const bool one = ops.size() == 1;
  const uint64_t id =
      recorder_->Issue(kind, next_p2p_seq_, ops[0].tensor.dtype(), bytes, one ? ops[0].peer : -1,
                       one ? ops[0].tag : -1);
  auto shared = std::make_shared<const std::vector<P2POp>>(std::move(ops));
  return scheduler_->Enqueue(
      name, next_p2p_seq_++,
      [this, shared, wait_sends](Op& op) { return P2P(op, shared, wait_sends); },
      absl::ZeroDuration(), id);
}

char* Engine::Stage(int i, size_t bytes) {
  if (stage_[i].size() < bytes) {
    stage_[i].resize(bytes);
    ChargeStaging(i, bytes);
  }
  return stage_[i].empty() ? &g_empty : stage_[i].data();
}

absl::Status Engine::Exchange(Op& op, uint32_t sig, absl::Span<const Leg> legs) {
  absl::InlinedVector<TransportReq, 4> reqs(legs.size());
  absl::InlinedVector<TransportReq*, 4> order;
  std::vector<TransportReq*>& ptrs = exchange_ptrs_;  // reused: no allocation per call
  ptrs.clear();
  const int me = transport_->rank();
  // Receives are posted before sends: a peer's message then finds its
  // buffer waiting instead of being staged as unexpected (a copy, and for
  // large messages a slower rendezvous path). (Sends first for small legs
  // measured 10-20% slower at 4-256 B: the unexpected path costs more.)
  for (size_t k = 0; k < 2 * legs.size(); ++k) {
    const size_t i = k % legs.size();
    const Leg& leg = legs[i];
    if (leg.is_send != (k >= legs.size())) continue;
    TransportReq& r = reqs[i];
    r.is_send = leg.is_send;
    r.peer = members_[leg.peer];
    uint32_t payload = ((op.seq & 0x1fffu) << 6) | (static_cast<uint32_t>(leg.step) & 63u);
    r.tag = MakeTag(ctx_, leg.is_send ? me : r.peer, false, payload, sig);
    r.buf = leg.bytes ? leg.buf : &g_empty;
    r.bytes = leg.bytes;
    order.push_back(&r);
  }
  transport_->PostAll(order.data(), order.size());
  for (TransportReq& r : reqs) ptrs.push_back(&r);
  return WaitLegs(
      *transport_, op, ptrs, scheduler_->abort_flag(), [&](size_t i) { return legs[i].peer; },
      [&](size_t i) {
        return absl::StrCat(legs[i].is_send ? "send to" : "receive from", " rank ", legs[i].peer);
      },
      [&] {
        // The legs point into the op's tensors and the staging: the
        // transport gets both. The staging moves out (the failure aborts
        // this engine, which runs no further op; one would allocate anew).
        struct Held {
          std::shared_ptr<const void> buffers;
          std::vector<char> stage[2];
        };
        auto held = std::make_shared<Held>();
        held->buffers = op.task;  // the op's tensors
        for (int i = 0; i < 2; ++i) {
          held->stage[i] = std::move(stage_[i]);
          stage_[i] = std::vector<char>();
          ChargeStaging(i, 0);
        }
        return std::shared_ptr<const void>(std::move(held));
      });
}

// --------------------------------------------------------------- collectives

WorkPtr Engine::AllReduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op) {
  absl::Status s = CheckAllReduce(input, output, device());
  if (!s.ok()) return Fail("all_reduce", flight::OpKind::kAllReduce, input, next_seq_, s);
  return Collective("all_reduce", flight::OpKind::kAllReduce, input.dtype(), input.nbytes(), -1,
                    Sig(kAllReduce, input.dtype(), input.numel(), static_cast<int>(op)),
                    [in = input, out = output, op, small = options_.small_bytes](Steps& steps) {
                      return RunAllReduce(steps, in, out, op, small);
                    });
}

WorkPtr Engine::Broadcast(const core::Tensor& input, const core::Tensor& output, int root) {
  absl::Status s = CheckBroadcast(input, output, root, size(), device());
  if (!s.ok()) return Fail("broadcast", flight::OpKind::kBroadcast, input, next_seq_, s);
  return Collective("broadcast", flight::OpKind::kBroadcast, input.dtype(), input.nbytes(), root,
                    Sig(kBroadcast, input.dtype(), input.numel(), root),
                    [in = input, out = output, root](Steps& steps) {
                      return RunBroadcast(steps, in, out, root);
                    });
}

WorkPtr Engine::Reduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op,
                       int root) {
  absl::Status s = CheckReduce(input, output, root, size(), device());
  if (!s.ok()) return Fail("reduce", flight::OpKind::kReduce, input, next_seq_, s);
  return Collective("reduce", flight::OpKind::kReduce, input.dtype(), input.nbytes(), root,
                    Sig(kReduce, input.dtype(), input.numel(), root * 8 + static_cast<int>(op)),
                    [in = input, out = output, op, root](Steps& steps) {
                      return RunReduce(steps, in, out, op, root);
                    });
}

WorkPtr Engine::AllGather(const core::Tensor& input, const core::Tensor& output) {
  absl::Status s = CheckAllGather(input, output, rank_, size(), device());
  if (!s.ok()) return Fail("all_gather", flight::OpKind::kAllGather, input, next_seq_, s);
  return Collective(
      "all_gather", flight::OpKind::kAllGather, input.dtype(), input.nbytes(), -1,
      Sig(kAllGather, input.dtype(), input.numel(), 0),
      [in = input, out = output](Steps& steps) { return RunAllGather(steps, in, out); });
}

WorkPtr Engine::ReduceScatter(const core::Tensor& input, const core::Tensor& output,
                              ReduceOp op) {
  absl::Status s = CheckReduceScatter(input, output, rank_, size(), device());
  if (!s.ok()) {
    return Fail("reduce_scatter", flight::OpKind::kReduceScatter, input, next_seq_, s);
  }
  return Collective("reduce_scatter", flight::OpKind::kReduceScatter, input.dtype(), input.nbytes(),
                    -1, Sig(kReduceScatter, input.dtype(), output.numel(), static_cast<int>(op)),
                    [in = input, out = output, op](Steps& steps) {
                      return RunReduceScatter(steps, in, out, op);
                    });
}

WorkPtr Engine::AllToAll(const core::Tensor& input, const core::Tensor& output) {
  absl::Status s = CheckAllToAll(input, output, size(), device());
  if (!s.ok()) return Fail("all_to_all", flight::OpKind::kAllToAll, input, next_seq_, s);
  return Collective("all_to_all", flight::OpKind::kAllToAll, input.dtype(), input.nbytes(), -1,
                    Sig(kAllToAll, input.dtype(), input.numel(), 0),
                    [in = input, out = output, small = options_.small_bytes](Steps& steps) {
                      return RunAllToAll(steps, in, out, small);
                    });
}

WorkPtr Engine::AllToAllV(const core::Tensor& input, const std::vector<int64_t>& send_counts,
                          const core::Tensor& output, const std::vector<int64_t>& recv_counts) {
  absl::Status s =
      CheckAllToAllV(input, send_counts, output, recv_counts, rank_, size(), device());
  if (!s.ok()) return Fail("all_to_all_v", flight::OpKind::kAllToAllV, input, next_seq_, s);
  // Counts differ per pair, so the signature has none: the receiver's exact
  // length check catches a send count that is not the receive count.
  return Collective("all_to_all_v", flight::OpKind::kAllToAllV, input.dtype(), input.nbytes(), -1,
                    Sig(kAllToAllV, input.dtype(), 0, 0),
                    [in = input, sends = send_counts, out = output, recvs = recv_counts,
                     small = options_.small_bytes](Steps& steps) {
                      return RunAllToAllV(steps, in, sends, out, recvs, small);
                    });
}

WorkPtr Engine::Barrier() { return BarrierWithin(absl::ZeroDuration()); }

WorkPtr Engine::BarrierWithin(absl::Duration op_timeout) {
  return Collective("barrier", flight::OpKind::kBarrier, core::DType::kU8, 0, -1,
                    Sig(kBarrier, core::DType::kU8, 0, 0),
                    [](Steps& steps) { return RunBarrier(steps); }, op_timeout);
}

// ------------------------------------------------------------ point to point

absl::Status Engine::P2P(Op& op, const std::shared_ptr<const std::vector<P2POp>>& shared_ops,
                         bool wait_sends) {
  const std::vector<P2POp>& ops = *shared_ops;
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
    // Set before posting: a send left to the background is cancelled by
    // the scheduler, which does not know its tensor.
    r->keep_alive = shared_ops;
    transport_->Post(r.get());
    ptrs.push_back(r.get());
    reqs.push_back(std::move(r));
  }
  if (!wait_sends) {  // a single Send: completes in the background
    scheduler_->FinishInBackground(op, std::move(reqs[0]), ops[0].peer);
    return absl::OkStatus();
  }
  return WaitLegs(
      *transport_, op, ptrs, scheduler_->abort_flag(), [&](size_t i) { return ops[i].peer; },
      [&](size_t i) {
        return absl::StrCat(ops[i].kind == P2POp::Kind::kSend ? "send to" : "receive from",
                            " rank ", ops[i].peer, " (tag ", ops[i].tag, ")");
      },
      [&] { return std::shared_ptr<const void>(shared_ops); });
}

WorkPtr Engine::Send(const core::Tensor& tensor, int peer, int tag) {
  absl::Status s = CheckP2P("send", tensor, peer, tag, rank_, size(), device());
  if (!s.ok()) return Fail("send", flight::OpKind::kSend, tensor, next_p2p_seq_, s);
  return PointToPoint("send", flight::OpKind::kSend, {{P2POp::Kind::kSend, tensor, peer, tag}}, false);
}

WorkPtr Engine::Recv(const core::Tensor& tensor, int peer, int tag) {
  absl::Status s = CheckP2P("recv", tensor, peer, tag, rank_, size(), device());
  if (!s.ok()) return Fail("recv", flight::OpKind::kRecv, tensor, next_p2p_seq_, s);
  return PointToPoint("recv", flight::OpKind::kRecv, {{P2POp::Kind::kRecv, tensor, peer, tag}}, true);
}

WorkPtr Engine::BatchSendRecv(const std::vector<P2POp>& ops) {
  absl::Status s = CheckBatch(ops, rank_, size(), device());
  if (!s.ok()) {
    return Fail("batch_send_recv", flight::OpKind::kBatchSendRecv,
                ops.empty() ? core::Tensor() : ops[0].tensor, next_p2p_seq_, s);
  }
  if (ops.empty()) return CompletedWork(absl::OkStatus(), "batch_send_recv (empty)");
  return PointToPoint("batch_send_recv", flight::OpKind::kBatchSendRecv, ops, true);
}

// --------------------------------------------------------------------- split

absl::StatusOr<std::unique_ptr<Communicator>> Engine::Split(int color, int key,
                                                            const std::string& name) {
  const int n = size();
  auto in = core::Tensor::Empty({3}, core::DType::kI32);
  auto out = core::Tensor::Empty({3 * static_cast<int64_t>(n)}, core::DType::kI32);
  if (!in.ok()) return in.status();
  if (!out.ok()) return out.status();
  auto error = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("split of group '", group_name(), "' into '", name,
                                               "': ", s.message()));
  };
  // Three numbers from every member: all[3 * j + i] is member j's i-th.
  const int32_t* all = out->data<int32_t>();
  auto gather = [&](int32_t a, int32_t b, int32_t c) {
    int32_t* mine = in->data<int32_t>();
    mine[0] = a;
    mine[1] = b;
    mine[2] = c;
    return AllGather(*in, *out)->Wait();
  };
  color = std::max(color, -1);
  absl::Status s = gather(color, key, static_cast<int32_t>(contexts_->Proposal()));
  if (!s.ok()) return error(s);
  uint32_t base = 0;
  std::map<int, int> color_index;
  std::vector<std::pair<std::pair<int, int>, int>> chosen;  // ((key, old rank), transport rank)
  for (int j = 0; j < n; ++j) {
    base = std::max(base, static_cast<uint32_t>(all[3 * j + 2]));
    if (all[3 * j] >= 0) color_index.emplace(all[3 * j], 0);
    if (color >= 0 && all[3 * j] == color) chosen.push_back({{all[3 * j + 1], j}, members_[j]});
  }
  int idx = 0;
  for (auto& [c, i] : color_index) i = idx++;
  const uint32_t groups = static_cast<uint32_t>(color_index.size());
  // The groups take ids base, base + 1, ...: each member claims its group's
  // and all vote. A claim fails where a concurrent Split over this endpoint
  // took or claimed the id since the proposal; then every member (deciding
  // from the same votes) tries again from the new proposals, which lie above
  // this round's claims.
  absl::BitGen gen;
  uint32_t id = 0;  // this rank's group's
  for (int attempt = 0;; ++attempt) {
    if (base + groups > static_cast<uint32_t>(kMaxContexts)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "split of group '", group_name(), "': more than ", kMaxContexts,
          " communicators created over this endpoint; create groups once and reuse them"));
    }
    id = color >= 0 ? base + color_index[color] : 0;
    const bool claimed = color >= 0 && contexts_->TryClaim(id);
    s = gather(color < 0 || claimed ? 1 : 0, static_cast<int32_t>(contexts_->Proposal()), 0);
    bool agreed = s.ok();
    base = 0;
    for (int j = 0; j < n && s.ok(); ++j) {
      agreed = agreed && all[3 * j] == 1;
      base = std::max(base, static_cast<uint32_t>(all[3 * j + 1]));
    }
    if (agreed) {
      if (claimed) contexts_->Take(id);
      break;
    }
    if (claimed) contexts_->Release(id);
    if (!s.ok()) return error(s);
    // A random pause, so that two Splits claiming the same ids part.
    absl::SleepFor(absl::Microseconds(absl::Uniform(gen, 0, 100 << std::min(attempt, 7))));
  }
  if (color < 0) return std::unique_ptr<Communicator>();
  std::sort(chosen.begin(), chosen.end());
  std::vector<int> members;
  for (auto& c : chosen) members.push_back(c.second);
  EngineOptions child = options_;
  child.comm.group_name = name;
  return std::unique_ptr<Communicator>(
      new Engine(transport_, std::move(members), id, child, backend_name_, contexts_));
}

}  // namespace loom::comm::internal
