#include "comm/mpi/communicator.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "comm/flight/recorder.h"
#include "comm/internal/checks.h"
#include "comm/internal/clock.h"
#include "comm/internal/reduce.h"
#include "comm/internal/small_allreduce.h"
#include "core/dtype.h"

namespace loom::comm::mpi {
namespace {

using core::DType;
using core::Tensor;

std::string MpiError(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

template <DType D, ReduceOp Op>
void UserOp(void* in, void* inout, int* len, MPI_Datatype*) {
  internal::ReduceInto(inout, in, static_cast<size_t>(*len), D, Op);
}

// Requests that no handle watches any more (a failed op, a dropped handle)
// and every buffer they may still touch: the op's tensors and its staging.
struct Abandoned {
  std::vector<MPI_Request> reqs;  // MPI_REQUEST_NULL once complete
  absl::InlinedVector<Tensor, 2> tensors;
  std::vector<char> scratch;
  // false after an MPI error: which requests are still valid is unknown, so
  // they are never tested again (and their buffers never freed).
  bool testable = true;
};

// Buffers MPI may use for the rest of the process (MPI is never finalized
// after a failure): never freed, but reachable, so leak checkers stay quiet.
std::vector<Abandoned>& KeptForever() {
  static auto* kept = new std::vector<Abandoned>();
  return *kept;
}

class MpiWork;

struct Runtime {
  std::mutex mu;  // every MPI call, and everything below
  // One Split of this process at a time (see MpiCommunicator::Split). A flag
  // under a plain mutex rather than std::timed_mutex: GCC 12's TSan does not
  // see try_lock_for (pthread_mutex_clocklock) and would report every unlock.
  std::mutex split_mu;
  std::condition_variable split_cv;
  bool splitting = false;
  // An op failed (timeout, MPI error): a peer may be dead, and MPI_Finalize
  // would then hang; it is skipped.
  bool poisoned = false;
  MPI_Op half_ops[2][5];  // [bf16, f16][op]
  // Kept until MPI completes (or cancels) their requests; see MpiWork.
  std::vector<Abandoned> abandoned;
  // Multi-step ops (small all-reduces) in issue order: any poll advances
  // them all, so a peer waiting on one of them is never held up by which
  // handle this process happens to wait on. A dropped handle leaves.
  std::vector<std::weak_ptr<MpiWork>> stepping;
  bool progressing = false;
  void ProgressSteppingLocked(const MpiWork* except);  // (mu held)

  // Lets go of what MPI is done with (mu held). Cheap when nothing is
  // abandoned: every poll calls it.
  void SweepLocked() {
    if (abandoned.empty()) return;
    for (auto it = abandoned.begin(); it != abandoned.end();) {
      int flag = 0;
      if (it->testable && MPI_Testall(static_cast<int>(it->reqs.size()), it->reqs.data(), &flag,
                                      MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
        it->testable = false;
        poisoned = true;
      }
      it = flag ? abandoned.erase(it) : it + 1;
    }
  }

  ~Runtime() {
    SweepLocked();
    if (poisoned) {
      for (Abandoned& a : abandoned) KeptForever().push_back(std::move(a));
      return;
    }
    for (auto& row : half_ops) {
      for (MPI_Op& op : row) MPI_Op_free(&op);
    }
    // Requests still pending (a collective some peer never joined, an
    // unmatched send) end here; only then are their buffers freed.
    MPI_Finalize();
  }
};

template <DType D>
void MakeHalfOps(MPI_Op* ops) {
  MPI_Op_create(&UserOp<D, ReduceOp::kSum>, 1, &ops[0]);
  MPI_Op_create(&UserOp<D, ReduceOp::kSum>, 1, &ops[1]);  // avg = sum, then divide
  MPI_Op_create(&UserOp<D, ReduceOp::kMax>, 1, &ops[2]);
  MPI_Op_create(&UserOp<D, ReduceOp::kMin>, 1, &ops[3]);
  MPI_Op_create(&UserOp<D, ReduceOp::kProd>, 1, &ops[4]);
}

MPI_Datatype TypeOf(DType d) {
  switch (d) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

int OpIndex(ReduceOp op) { return static_cast<int>(op); }

struct CommState {
  std::shared_ptr<Runtime> rt;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::string name;
  absl::Duration timeout;
  // Descriptions number collectives (the same number on every rank) and
  // point-to-point ops (ranks issue different numbers of them) apart.
  uint64_t seq = 0;
  uint64_t p2p_seq = 0;
  absl::Status aborted;  // guarded by rt->mu
  // The flight recorder (comm/flight/recorder.h): ops are recorded when
  // issued and started at once (MPI starts them when posted), completed when
  // a poll finds them done or failed; the first abort dumps.
  std::shared_ptr<flight::Recorder> recorder;
  std::string flight_dir;  // inherited by Split children
  int flight_entries = 2048;
  // A duplicate of `comm` for the point-to-point steps of our own algorithms
  // (small all-reduce): they never meet a caller's message or tag.
  MPI_Comm steps_comm = MPI_COMM_NULL;
  size_t small_allreduce_bytes = 0;  // inherited by Split children
  // Sets `aborted` (rt->mu held) and dumps if it is the first failure.
  void AbortLocked(const absl::Status& why) {
    if (!aborted.ok()) return;
    aborted = why;
    recorder->FailureDump(why);
  }
  ~CommState() {
    std::lock_guard<std::mutex> l(rt->mu);
    if (aborted.ok() && steps_comm != MPI_COMM_NULL) MPI_Comm_free(&steps_comm);
    if (aborted.ok() && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  MPI_Op OpFor(DType d, ReduceOp op) const {
    if (d == DType::kBF16) return rt->half_ops[0][OpIndex(op)];
    if (d == DType::kF16) return rt->half_ops[1][OpIndex(op)];
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: return MPI_SUM;
      case ReduceOp::kMax: return MPI_MAX;
      case ReduceOp::kMin: return MPI_MIN;
      case ReduceOp::kProd: return MPI_PROD;
    }
    return MPI_SUM;
  }
};

// "all_reduce #7 in group 'dp' (mpi backend, rank 0 of 2)".
std::string DescribeOp(const CommState& st, const char* what, uint64_t seq) {
  return absl::StrCat(what, " #", seq, " in group '", st.name, "' (mpi backend, rank ", st.rank,
                      " of ", st.size, ")");
}

// One op's requests. The contract (comm.h) on failure: the communicator is
// aborted, and every buffer MPI may still touch stays alive until MPI is
// done with it. A failed op's requests may stay pending in MPI (a late peer
// still writes into them), so its tensors and staging go, with the requests,
// to Runtime::abandoned, which releases them once MPI completes them:
// receives are cancelled first; sends and collectives cannot be, and
// complete when the peers arrive, or never (their memory is then kept for
// the life of the process). A dropped handle of a running op does the same.
class MpiWork : public Work {
 public:
  // `timeout`: the op's own limit (zero: the communicator's).
  // `what`: the op's name, a string literal (the description is made only
  // when asked for: an error, a dump).
  MpiWork(std::shared_ptr<CommState> st, const char* what, uint64_t seq, uint64_t flight_id,
          absl::Duration timeout = absl::ZeroDuration())
      : seq(seq),
        st_(std::move(st)),
        flight_id_(flight_id),
        what_(what),
        timeout_(timeout > absl::ZeroDuration() ? timeout : st_->timeout),
        deadline_ns_(internal::CoarseNowNs() + absl::ToInt64Nanoseconds(timeout_)) {}
  ~MpiWork() override {
    if (reqs.empty()) return;  // finished, never posted, or already abandoned
    std::lock_guard<std::mutex> l(st_->rt->mu);
    AbandonLocked();
  }

  const uint64_t seq;  // in its sequence (collectives or point-to-point)
  // Set while issuing (rt->mu held). Unposted requests are MPI_REQUEST_NULL.
  // (Inline: a small op's latency is in its allocations.)
  absl::InlinedVector<MPI_Request, 2> reqs;
  absl::InlinedVector<int, 2> expect_elems;  // recv legs: elements expected (-1: not a recv)
  absl::InlinedVector<MPI_Datatype, 2> recv_types;
  std::function<void()> on_success;  // post-processing (avg, copies)
  // Per-op staging (in-place reduce-scatter, small all-reduce): on the heap,
  // so that it stays put when an abandoned op hands it over.
  std::vector<char> scratch;
  absl::InlinedVector<Tensor, 2> keep;  // the op's tensors, referenced while MPI may use them
  absl::InlinedVector<MPI_Status, 2> statuses;
  // A multi-step op: its steps (legs on st_->steps_comm with tags
  // plan_tag + leg.step), posted one after the other as each completes.
  std::optional<internal::SmallAllReduce> plan;
  int plan_step = 0;
  int plan_tag = 0;

  bool done() const { return done_; }

  // Posts plan[plan_step]'s legs, receives first (rt->mu held).
  int PostStepLocked() {
    const internal::SmallAllReduce::Legs legs = plan->StepLegs(plan_step);
    reqs.assign(legs.size(), MPI_REQUEST_NULL);
    expect_elems.assign(legs.size(), -1);
    recv_types.assign(legs.size(), MPI_BYTE);
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < legs.size(); ++i) {
        const internal::Leg& leg = legs[i];
        if (leg.is_send != (pass == 1)) continue;
        const int bytes = static_cast<int>(leg.bytes);
        int rc;
        if (leg.is_send) {
          rc = MPI_Isend(leg.buf, bytes, MPI_BYTE, leg.peer, plan_tag + leg.step, st_->steps_comm,
                         &reqs[i]);
        } else {
          expect_elems[i] = bytes;
          rc = MPI_Irecv(leg.buf, bytes, MPI_BYTE, leg.peer, plan_tag + leg.step, st_->steps_comm,
                         &reqs[i]);
        }
        if (rc != MPI_SUCCESS) return rc;
      }
    }
    return MPI_SUCCESS;
  }

  void FailNow(absl::Status s) {
    if (!done_) st_->recorder->Complete(flight_id_, false);
    done_ = true;
    status_ = std::move(s);
  }

  // Fails the op and aborts the communicator with its error (rt->mu held);
  // its requests, if any are pending, are abandoned.
  void FailAndAbortLocked(absl::Status s) {
    FailNow(std::move(s));
    AbandonLocked();
    st_->AbortLocked(status_);
  }

  bool Poll() override {
    std::lock_guard<std::mutex> l(st_->rt->mu);
    return PollLocked(true);
  }

  absl::Status Wait(absl::Duration timeout) override {
    const int64_t until = internal::CoarseNowNs() + absl::ToInt64Nanoseconds(timeout);
    for (int spins = 1;; ++spins) {
      {
        // A few polls per lock: taking it costs about as much as a poll.
        std::lock_guard<std::mutex> l(st_->rt->mu);
        for (int k = 0; k < 8; ++k) {
          if (PollLocked(k == 0 && (spins & 7) == 0)) return status_;
        }
      }
      if ((spins & 7) == 0 && internal::CoarseNowNs() >= until) {
        return absl::DeadlineExceededError(absl::StrCat(
            Describe(), " did not finish within ", absl::FormatDuration(timeout),
            " of waiting (the operation's own limit is ", absl::FormatDuration(timeout_), ")"));
      }
      if (spins > 32) sched_yield();
    }
  }
  absl::Status Wait() override {
    return Wait(timeout_ + std::max(absl::Seconds(5), timeout_ / 10));
  }
  std::string Describe() const override { return DescribeOp(*st_, what_, seq); }

 private:
  // Hands the pending requests and the buffers they may touch to the
  // runtime (rt->mu held); receives are cancelled.
  void AbandonLocked() {
    bool pending = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == MPI_REQUEST_NULL) continue;
      pending = true;
      if (i < expect_elems.size() && expect_elems[i] >= 0) MPI_Cancel(&reqs[i]);
    }
    if (pending) {
      st_->rt->abandoned.push_back(
          Abandoned{{reqs.begin(), reqs.end()}, std::move(keep), std::move(scratch), true});
    }
    Release();
  }

  void Release() {
    reqs.clear();
    keep.clear();
    scratch.clear();
    plan.reset();          // it points into the op's buffers
    on_success = nullptr;  // holds tensors too
  }

  bool PollLocked(bool check_deadline) {
    if (done_) return true;
    st_->rt->SweepLocked();
    st_->rt->ProgressSteppingLocked(this);
    return PollSelfLocked(check_deadline);
  }

 private:
  friend struct Runtime;

  bool PollSelfLocked(bool check_deadline) {
    if (done_) return true;
    if (!st_->aborted.ok()) {
      FailNow(absl::FailedPreconditionError(absl::StrCat(
          Describe(),
          ": the communicator was aborted by an earlier error: ", st_->aborted.message())));
      AbandonLocked();
      return true;
    }
    int flag = 0;
    statuses.resize(reqs.size());
    int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag,
                         expect_elems.empty() ? MPI_STATUSES_IGNORE : statuses.data());
    if (rc != MPI_SUCCESS) {
      std::string detail = MpiError(rc);
      if (rc == MPI_ERR_IN_STATUS) {
        for (auto& s : statuses) {
          if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
            detail = MpiError(s.MPI_ERROR);
          }
        }
      }
      FailNow(absl::InternalError(absl::StrCat(Describe(), ": MPI error: ", detail)));
      st_->AbortLocked(status_);
      st_->rt->poisoned = true;
      // Which requests are still valid is unknown: never test them again.
      KeptForever().push_back(
          Abandoned{{reqs.begin(), reqs.end()}, std::move(keep), std::move(scratch), false});
      Release();
      return true;
    }
    if (flag) {
      reqs.clear();  // all complete
      for (size_t i = 0; i < expect_elems.size(); ++i) {
        if (expect_elems[i] < 0) continue;
        int got = 0;
        MPI_Get_count(&statuses[i], recv_types[i], &got);
        if (got != expect_elems[i]) {
          FailAndAbortLocked(absl::InvalidArgumentError(absl::StrCat(
              Describe(), ": received ", got, " elements from rank ", statuses[i].MPI_SOURCE,
              ", expected ", expect_elems[i], " (element counts differ across ranks)")));
          return true;
        }
      }
      if (plan) {
        plan->Finish(plan_step);
        if (++plan_step < plan->steps()) {
          const int rc = PostStepLocked();
          if (rc != MPI_SUCCESS) {
            FailAndAbortLocked(absl::InternalError(absl::StrCat(
                Describe(), ": ", MpiError(rc), " (the communicator is now aborted)")));
            return true;
          }
          return false;
        }
      }
      if (on_success) on_success();
      Release();
      st_->recorder->Complete(flight_id_, true);
      done_ = true;
      return true;
    }
    if (check_deadline && internal::CoarseNowNs() >= deadline_ns_) {
      st_->rt->poisoned = true;  // pending requests: MPI_Finalize would hang
      FailAndAbortLocked(absl::DeadlineExceededError(absl::StrCat(
          Describe(), " timed out after ", absl::FormatDuration(timeout_),
          ": ranks that did not arrive: unknown (MPI cannot report which ranks are missing)")));
    }
    return done_;
  }

  std::shared_ptr<CommState> st_;
  const uint64_t flight_id_;
  const char* what_;
  absl::Duration timeout_;
  int64_t deadline_ns_;  // internal::CoarseNowNs()
  bool done_ = false;
  absl::Status status_;
};

void Runtime::ProgressSteppingLocked(const MpiWork* except) {
  if (stepping.empty() || progressing) return;
  progressing = true;
  size_t kept = 0;
  for (size_t i = 0; i < stepping.size(); ++i) {
    std::shared_ptr<MpiWork> w = stepping[i].lock();
    if (w == nullptr || w->done()) continue;
    if (w.get() != except) w->PollSelfLocked(false);
    if (!w->done()) stepping[kept++] = stepping[i];
  }
  stepping.resize(kept);
  progressing = false;
}

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<CommState> st) : st_(std::move(st)) {}
  int rank() const override { return st_->rank; }
  int size() const override { return st_->size; }
  core::Device device() const override { return core::Device::CPU(); }
  const std::string& group_name() const override { return st_->name; }
  const char* backend_name() const override { return "mpi"; }
  using Communicator::AllReduce;
  using Communicator::Broadcast;

  WorkPtr AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) override {
    if (auto s = internal::CheckAllReduce(in, out, device()); !s.ok()) return Fail("all_reduce", s);
    if (size() > 1 && in.numel() > 0 && in.nbytes() <= st_->small_allreduce_bytes) {
      return Issue("all_reduce", {in, out}, in.numel(), [&](MpiWork& w) {
        if (in.raw_data() != out.raw_data())
          std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
        AddAvg(w, out, op);
        w.scratch.resize(internal::SmallAllReduce::StageBytes(size(), in.nbytes()));
        w.plan.emplace(rank(), size(), static_cast<char*>(out.raw_data()), w.scratch.data(),
                       in.nbytes(), in.numel(), in.dtype(), op);
        // Tags tell apart up to 256 consecutive all-reduces' steps (< 64 each).
        w.plan_tag = static_cast<int>(w.seq % 256) * 64;
        return w.PostStepLocked();
      });
    }
    return Issue("all_reduce", {in, out}, in.numel(), [&](MpiWork& w) {
      const void* src = in.raw_data() == out.raw_data() ? MPI_IN_PLACE : in.raw_data();
      AddAvg(w, out, op);
      return MPI_Iallreduce(src, out.raw_data(), static_cast<int>(in.numel()),
                            TypeOf(in.dtype()), st_->OpFor(in.dtype(), op), st_->comm,
                            &w.reqs[0]);
    });
  }

  WorkPtr Broadcast(const Tensor& in, const Tensor& out, int root) override {
    if (auto s = internal::CheckBroadcast(in, out, root, size(), device()); !s.ok()) {
      return Fail("broadcast", s);
    }
    return Issue("broadcast", {in, out}, in.numel(), [&](MpiWork& w) {
      if (rank() == root && in.raw_data() != out.raw_data()) {
        std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
      }
      return MPI_Ibcast(out.raw_data(), static_cast<int>(out.numel()), TypeOf(out.dtype()), root,
                        st_->comm, &w.reqs[0]);
    }, absl::ZeroDuration(), false, root);
  }

  WorkPtr Reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root) override {
    if (auto s = internal::CheckReduce(in, out, root, size(), device()); !s.ok()) {
      return Fail("reduce", s);
    }
    return Issue("reduce", {in, out}, in.numel(), [&](MpiWork& w) {
      const bool at_root = rank() == root;
      const void* src = at_root && in.raw_data() == out.raw_data() ? MPI_IN_PLACE : in.raw_data();
      if (at_root) AddAvg(w, out, op);
      return MPI_Ireduce(src, at_root ? out.raw_data() : nullptr, static_cast<int>(in.numel()),
                         TypeOf(in.dtype()), st_->OpFor(in.dtype(), op), root, st_->comm,
                         &w.reqs[0]);
    }, absl::ZeroDuration(), false, root);
  }

  WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    if (auto s = internal::CheckAllGather(in, out, rank(), size(), device()); !s.ok()) {
      return Fail("all_gather", s);
    }
    return Issue("all_gather", {in, out}, out.numel(), [&](MpiWork& w) {
      char* slot = static_cast<char*>(out.raw_data()) + rank() * in.nbytes();
      const void* src = in.raw_data() == slot ? MPI_IN_PLACE : in.raw_data();
      MPI_Datatype t = TypeOf(in.dtype());
      int n = static_cast<int>(in.numel());
      return MPI_Iallgather(src, n, t, out.raw_data(), n, t, st_->comm, &w.reqs[0]);
    });
  }

  WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    if (auto s = internal::CheckReduceScatter(in, out, rank(), size(), device()); !s.ok()) {
      return Fail("reduce_scatter", s);
    }
    return Issue("reduce_scatter", {in, out}, in.numel(), [&](MpiWork& w) {
      const bool in_place =
          out.raw_data() == static_cast<char*>(in.raw_data()) + rank() * out.nbytes();
      void* dst = out.raw_data();
      if (in_place) {  // MPI's in-place layout differs from NCCL's: stage it
        w.scratch.resize(std::max<size_t>(out.nbytes(), 1));
        dst = w.scratch.data();
        Tensor o = out;
        size_t bytes = out.nbytes();
        MpiWork* wp = &w;
        w.on_success = [wp, o, bytes] { std::memcpy(o.raw_data(), wp->scratch.data(), bytes); };
      }
      AddAvg(w, out, op);
      return MPI_Ireduce_scatter_block(in.raw_data(), dst, static_cast<int>(out.numel()),
                                       TypeOf(in.dtype()), st_->OpFor(in.dtype(), op), st_->comm,
                                       &w.reqs[0]);
    });
  }

  WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    if (auto s = internal::CheckAllToAll(in, out, size(), device()); !s.ok()) {
      return Fail("all_to_all", s);
    }
    return Issue("all_to_all", {in, out}, in.numel(), [&](MpiWork& w) {
      const void* src = in.raw_data() == out.raw_data() ? MPI_IN_PLACE : in.raw_data();
      int n = static_cast<int>(in.numel() / size());
      MPI_Datatype t = TypeOf(in.dtype());
      return MPI_Ialltoall(src, n, t, out.raw_data(), n, t, st_->comm, &w.reqs[0]);
    });
  }

  WorkPtr AllToAllV(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    if (auto s = internal::CheckAllToAllV(in, send_counts, out, recv_counts, rank(), size(),
                                          device());
        !s.ok()) {
      return Fail("all_to_all_v", s);
    }
    // Counts and displacements are MPI ints (elements): the larger total
    // bounds every one of them.
    return Issue("all_to_all_v", {in, out}, std::max(in.numel(), out.numel()), [&](MpiWork& w) {
      // MPI may read the arrays until the op completes: they live in its
      // scratch, which stays with its requests (abandoned ones too).
      const int n = size();
      w.scratch.resize(4 * n * sizeof(int));
      int* sc = reinterpret_cast<int*>(w.scratch.data());
      int *sd = sc + n, *rc = sc + 2 * n, *rd = sc + 3 * n;
      for (int j = 0; j < n; ++j) {
        sc[j] = static_cast<int>(send_counts[j]);
        rc[j] = static_cast<int>(recv_counts[j]);
        sd[j] = j == 0 ? 0 : sd[j - 1] + sc[j - 1];
        rd[j] = j == 0 ? 0 : rd[j - 1] + rc[j - 1];
      }
      MPI_Datatype t = TypeOf(in.dtype());
      return MPI_Ialltoallv(in.raw_data(), sc, sd, t, out.raw_data(), rc, rd, t, st_->comm,
                            &w.reqs[0]);
    });
  }

  WorkPtr Send(const Tensor& t, int peer, int tag) override {
    if (auto s = internal::CheckP2P("send", t, peer, tag, rank(), size(), device()); !s.ok()) {
      return Fail("send", s, /*point_to_point=*/true);
    }
    return BatchImpl("send", {{P2POp::Kind::kSend, t, peer, tag}});
  }
  WorkPtr Recv(const Tensor& t, int peer, int tag) override {
    if (auto s = internal::CheckP2P("recv", t, peer, tag, rank(), size(), device()); !s.ok()) {
      return Fail("recv", s, /*point_to_point=*/true);
    }
    return BatchImpl("recv", {{P2POp::Kind::kRecv, t, peer, tag}});
  }
  WorkPtr BatchSendRecv(const std::vector<P2POp>& ops) override {
    if (auto s = internal::CheckBatch(ops, rank(), size(), device()); !s.ok()) {
      return Fail("batch_send_recv", s, /*point_to_point=*/true);
    }
    return BatchImpl("batch_send_recv", ops);
  }

  WorkPtr Barrier() override { return BarrierWithin(absl::ZeroDuration()); }
  WorkPtr BarrierWithin(absl::Duration op_timeout) override {
    return Issue(
        "barrier", {}, 0, [&](MpiWork& w) { return MPI_Ibarrier(st_->comm, &w.reqs[0]); },
        op_timeout);
  }

  // No blocking MPI_Comm_split (it waited for every rank with no limit while
  // holding the process-wide MPI lock, freezing every other wait of the
  // process). Instead: (1) every rank's (color, key) through a non-blocking
  // all-gather, waited for like any collective (the lock is held only per
  // poll; at the op timeout the split fails with DeadlineExceeded and this
  // communicator is aborted); (2) the child over exactly its members with
  // MPI_Comm_create_group, which only they call. That call blocks (OpenMPI
  // 4.1 has no non-blocking way to make a communicator over a subgroup), but
  // only until the other members reach it: each has contributed to the
  // all-gather, so it is inside this Split, and reaches the call without
  // waiting on anyone, because a process runs one Split at a time
  // (split_mu; so two threads' Splits cannot each hold up the other's
  // members). Only a member that dies in between can stall it.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                       const std::string& name) override {
    const std::string what = absl::StrCat("split of group '", st_->name, "' into '", name, "'");
    auto error = [&](const absl::Status& s) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    };
    Runtime& rt = *st_->rt;
    std::unique_lock<std::mutex> turn(rt.split_mu);
    if (!rt.split_cv.wait_for(turn, absl::ToChronoMilliseconds(std::min(st_->timeout, absl::Hours(24))),
                              [&] { return !rt.splitting; })) {
      // Fails like the all-gather below would: it takes its number and
      // aborts, so this rank's next collective never pairs with it.
      absl::Status e = absl::DeadlineExceededError(absl::StrCat(
          "another Split of this process did not finish within ",
          absl::FormatDuration(st_->timeout)));
      turn.unlock();
      Fail("split", e);
      return error(e);
    }
    rt.splitting = true;
    turn.unlock();
    // Ends this process's turn however Split returns.
    struct EndTurn {
      Runtime& rt;
      ~EndTurn() {
        {
          std::lock_guard<std::mutex> l(rt.split_mu);
          rt.splitting = false;
        }
        rt.split_cv.notify_one();
      }
    } end_turn{rt};
    const int n = size();
    Tensor mine = *Tensor::Empty({2}, DType::kI32);
    Tensor all = *Tensor::Empty({2 * static_cast<int64_t>(n)}, DType::kI32);
    mine.data<int32_t>()[0] = color < 0 ? -1 : color;
    mine.data<int32_t>()[1] = key;
    absl::Status s = Issue("split", {mine, all}, 2 * static_cast<int64_t>(n), [&](MpiWork& w) {
      return MPI_Iallgather(mine.raw_data(), 2, MPI_INT32_T, all.raw_data(), 2, MPI_INT32_T,
                            st_->comm, &w.reqs[0]);
    })->Wait();
    if (!s.ok()) return error(s);
    if (color < 0) return std::unique_ptr<Communicator>();
    std::vector<std::pair<std::pair<int32_t, int>, int>> order;  // ((key, old rank), old rank)
    for (int j = 0; j < n; ++j) {
      const int32_t* cj = all.data<int32_t>() + 2 * j;
      if (cj[0] == color) order.push_back({{cj[1], j}, j});
    }
    std::sort(order.begin(), order.end());
    std::vector<int> members;
    for (const auto& m : order) members.push_back(m.second);

    std::lock_guard<std::mutex> l(st_->rt->mu);
    if (!st_->aborted.ok()) {
      return error(absl::FailedPreconditionError(absl::StrCat(
          "the communicator was aborted by an earlier error: ", st_->aborted.message())));
    }
    MPI_Group parent_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm child = MPI_COMM_NULL;
    int rc = MPI_Comm_group(st_->comm, &parent_group);
    if (rc == MPI_SUCCESS) {
      rc = MPI_Group_incl(parent_group, static_cast<int>(members.size()), members.data(), &group);
    }
    // The tag is above every caller's (tags < kMaxTag): the creation's
    // messages on this communicator never meet a caller's receive.
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(st_->comm, group, kMaxTag, &child);
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (parent_group != MPI_GROUP_NULL) MPI_Group_free(&parent_group);
    if (rc != MPI_SUCCESS || child == MPI_COMM_NULL) {
      // The members may now disagree about this communicator: abort it.
      absl::Status e = error(absl::InternalError(absl::StrCat(
          "MPI_Comm_create_group: ", rc == MPI_SUCCESS ? "no communicator" : MpiError(rc),
          " (the parent communicator is now aborted)")));
      st_->AbortLocked(e);
      return e;
    }
    return std::unique_ptr<Communicator>(
        new MpiCommunicator(Wrap(st_->rt, child, name, st_->timeout, st_->flight_dir,
                                 st_->flight_entries, st_->small_allreduce_bytes)));
  }

  // `flight_dir`, `flight_entries`: CommOptions' flight recorder settings.
  static std::shared_ptr<CommState> Wrap(std::shared_ptr<Runtime> rt, MPI_Comm comm,
                                         const std::string& name, absl::Duration timeout,
                                         const std::string& flight_dir, int flight_entries,
                                         size_t small_allreduce_bytes) {
    auto st = std::make_shared<CommState>();
    st->rt = std::move(rt);
    st->comm = comm;
    st->name = name;
    st->timeout = timeout;
    st->flight_dir = flight_dir;
    st->flight_entries = flight_entries;
    st->small_allreduce_bytes = small_allreduce_bytes;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_dup(comm, &st->steps_comm);  // keeps the error handler
    MPI_Comm_rank(comm, &st->rank);
    MPI_Comm_size(comm, &st->size);
    // The group's members as MPI_COMM_WORLD ranks, for the dumps.
    flight::CommInfo fi;
    fi.group = name;
    fi.backend = "mpi";
    MPI_Comm_rank(MPI_COMM_WORLD, &fi.world_rank);
    fi.group_rank = st->rank;
    fi.group_size = st->size;
    fi.entries = flight_entries;
    fi.dir = flight_dir;
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    if (MPI_Comm_group(comm, &group) == MPI_SUCCESS &&
        MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS) {
      std::vector<int> ranks(st->size), in_world(st->size);
      for (int i = 0; i < st->size; ++i) ranks[i] = i;
      if (MPI_Group_translate_ranks(group, st->size, ranks.data(), world, in_world.data()) ==
          MPI_SUCCESS) {
        fi.members = std::move(in_world);
      }
    }
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
    st->recorder = flight::Recorder::Create(std::move(fi));
    return st;
  }

 private:
  std::string Describe(const char* what, uint64_t seq) const { return DescribeOp(*st_, what, seq); }

  // An argument error (comm.h): the handle fails with it, and the op still
  // takes its sequence number and aborts the communicator. MPI matches
  // collectives by issue order alone, so without the abort this rank's next
  // op would pair with the other ranks' copy of the rejected one, silently
  // when count and dtype agree.
  WorkPtr Fail(const char* what, const absl::Status& s, bool point_to_point = false) {
    uint64_t& sequence = point_to_point ? st_->p2p_seq : st_->seq;
    st_->recorder->Complete(
        st_->recorder->Issue(FlightKind(what), sequence, DType::kU8, 0), false);
    const std::string desc = Describe(what, sequence++);
    std::lock_guard<std::mutex> l(st_->rt->mu);
    st_->AbortLocked(absl::Status(s.code(), absl::StrCat(desc, ": ", s.message())));
    return CompletedWork(s, desc);
  }

  // The recorder's name of an op ("split" is its all-gather).
  static flight::OpKind FlightKind(const char* what) {
    flight::OpKind k = flight::OpKind::kAllGather;
    flight::ParseOpKind(what, &k);
    return k;
  }

  void AddAvg(MpiWork& w, const Tensor& out, ReduceOp op) const {
    if (op != ReduceOp::kAvg) return;
    auto prev = std::move(w.on_success);
    Tensor o = out;
    int n = size();
    w.on_success = [prev, o, n] {
      if (prev) prev();
      internal::FinishAvg(o.raw_data(), static_cast<size_t>(o.numel()), o.dtype(), n);
    };
  }

  // `keep`: the op's tensors, referenced until MPI is done with them (see
  // MpiWork). `start` posts the op's requests into w.reqs (sized to one,
  // or more if it resizes them, with MPI_REQUEST_NULL for unposted ones).
  // `point_to_point`: numbered in the point-to-point sequence.
  // `peer`, `tag`: the root or the peer and tag, for the flight recorder.
  template <typename Start>  // int(MpiWork&): not a std::function (no allocation)
  WorkPtr Issue(const char* what, absl::InlinedVector<Tensor, 2> keep, int64_t count,
                const Start& start, absl::Duration op_timeout = absl::ZeroDuration(),
                bool point_to_point = false, int peer = -1, int tag = -1) {
    if (count > INT_MAX) {
      return Fail(what, absl::InvalidArgumentError(absl::StrCat(
                            what, ": ", count, " elements exceed MPI's int count")),
                  point_to_point);
    }
    const uint64_t seq = point_to_point ? st_->p2p_seq++ : st_->seq++;
    uint64_t bytes = 0;
    for (size_t i = 0; i < keep.size() && (i == 0 || point_to_point); ++i) {
      bytes += keep[i].nbytes();  // the input (a batch: every leg)
    }
    const uint64_t flight_id = st_->recorder->Issue(
        FlightKind(what), seq, keep.empty() ? DType::kU8 : keep[0].dtype(), bytes, peer, tag);
    st_->recorder->Start(flight_id);  // MPI starts it when posted
    auto w = std::make_shared<MpiWork>(st_, what, seq, flight_id, op_timeout);
    std::lock_guard<std::mutex> l(st_->rt->mu);
    st_->rt->SweepLocked();
    if (!st_->aborted.ok()) {
      w->FailNow(absl::FailedPreconditionError(absl::StrCat(
          w->Describe(), ": the communicator was aborted by an earlier error: ",
          st_->aborted.message())));
      return w;
    }
    w->keep = std::move(keep);
    w->reqs.assign(1, MPI_REQUEST_NULL);
    int rc = start(*w);
    if (rc != MPI_SUCCESS) {
      // Legs posted before the error stay posted (cancelled if receives,
      // kept alive in any case), so this rank no longer matches the others.
      w->FailAndAbortLocked(absl::InternalError(
          absl::StrCat(w->Describe(), ": ", MpiError(rc), " (the communicator is now aborted)")));
    } else if (w->plan && w->plan->steps() > 1) {
      st_->rt->stepping.push_back(w);
    }
    return w;
  }

  WorkPtr BatchImpl(const char* what, const std::vector<P2POp>& ops) {
    // Every leg is checked before any is posted: a receive posted for a
    // batch that then fails would take the next message with its tag (and
    // every later one would shift by one).
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].tensor.numel() > INT_MAX) {
        return Fail(what,
                    absl::InvalidArgumentError(absl::StrCat(
                        what, ": leg ", i, " (",
                        ops[i].kind == P2POp::Kind::kSend ? "send to" : "recv from", " rank ",
                        ops[i].peer, ") has ", ops[i].tensor.numel(),
                        " elements, more than MPI's int count")),
                    /*point_to_point=*/true);
      }
    }
    absl::InlinedVector<Tensor, 2> keep;
    for (const P2POp& p : ops) keep.push_back(p.tensor);
    return Issue(what, std::move(keep), 0, [&](MpiWork& w) {
      w.reqs.assign(ops.size(), MPI_REQUEST_NULL);
      w.expect_elems.assign(ops.size(), -1);
      w.recv_types.assign(ops.size(), MPI_BYTE);
      // Receives first, so a batch that sends to and receives from the same
      // peer never waits on itself.
      for (size_t i = 0; i < ops.size(); ++i) {
        const P2POp& p = ops[i];
        if (p.kind != P2POp::Kind::kRecv) continue;
        MPI_Datatype t = TypeOf(p.tensor.dtype());
        // Marked as a receive before posting: a failed batch cancels it.
        w.expect_elems[i] = static_cast<int>(p.tensor.numel());
        w.recv_types[i] = t;
        int rc = MPI_Irecv(p.tensor.raw_data(), static_cast<int>(p.tensor.numel()), t, p.peer,
                           p.tag, st_->comm, &w.reqs[i]);
        if (rc != MPI_SUCCESS) return rc;
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        const P2POp& p = ops[i];
        if (p.kind != P2POp::Kind::kSend) continue;
        int rc = MPI_Isend(p.tensor.raw_data(), static_cast<int>(p.tensor.numel()),
                           TypeOf(p.tensor.dtype()), p.peer, p.tag, st_->comm, &w.reqs[i]);
        if (rc != MPI_SUCCESS) return rc;
      }
      return static_cast<int>(MPI_SUCCESS);
    }, absl::ZeroDuration(), /*point_to_point=*/true, ops.size() == 1 ? ops[0].peer : -1,
       ops.size() == 1 ? ops[0].tag : -1);
  }

  std::shared_ptr<CommState> st_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateWorld(const MpiOptions& options) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited || finalized) {
    return absl::FailedPreconditionError(
        finalized ? "mpi backend: MPI was already finalized in this process and cannot be "
                    "initialised again"
                  : "mpi backend: MPI is already initialised in this process; create the world "
                    "communicator once and use Split for sub-groups");
  }
  const std::string& alg = options.iallreduce_algorithm;
  if (!alg.empty()) {
    const char* code = alg == "ring" ? "1" : alg == "binomial" ? "2" : alg == "rabenseifner" ? "3" : nullptr;
    if (code == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mpi backend: iallreduce_algorithm '", alg, "' is not ring, binomial, rabenseifner or empty"));
    }
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", code, /*overwrite=*/0);
  }
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("mpi backend: MPI_Init_thread failed: ",
                                               MpiError(rc), " (run under mpirun?)"));
  }
  auto rt = std::make_shared<Runtime>();
  if (provided < MPI_THREAD_SERIALIZED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mpi backend: the MPI library provides thread level ", provided,
        ", below MPI_THREAD_SERIALIZED (needed: communicators may be used from several threads)"));
  }
  MakeHalfOps<DType::kBF16>(rt->half_ops[0]);
  MakeHalfOps<DType::kF16>(rt->half_ops[1]);
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  return std::unique_ptr<Communicator>(new MpiCommunicator(MpiCommunicator::Wrap(
      rt, world, options.comm.group_name, options.comm.timeout, options.comm.flight_recorder_dir,
      options.comm.flight_recorder_entries, options.small_allreduce_bytes)));
}

}  // namespace loom::comm::mpi
