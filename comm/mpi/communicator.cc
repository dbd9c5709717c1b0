#include "comm/mpi/communicator.h"

#include <mpi.h>
#include <sched.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/checks.h"
#include "comm/internal/reduce.h"
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

struct Runtime {
  std::mutex mu;  // every MPI call
  bool poisoned = false;
  MPI_Op half_ops[2][5];  // [bf16, f16][op]
  ~Runtime() {
    if (!poisoned) {
      for (auto& row : half_ops) {
        for (MPI_Op& op : row) MPI_Op_free(&op);
      }
      MPI_Finalize();
    }
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
  ~CommState() {
    std::lock_guard<std::mutex> l(rt->mu);
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

class MpiWork : public Work {
 public:
  // `timeout`: the op's own limit (zero: the communicator's).
  MpiWork(std::shared_ptr<CommState> st, std::string desc,
          absl::Duration timeout = absl::ZeroDuration())
      : st_(std::move(st)),
        desc_(std::move(desc)),
        timeout_(timeout > absl::ZeroDuration() ? timeout : st_->timeout),
        deadline_(absl::Now() + timeout_) {}

  // Called with rt->mu held, after issuing.
  std::vector<MPI_Request> reqs;
  std::vector<int> expect_elems;      // recv legs: elements expected (-1: not a recv)
  std::vector<MPI_Datatype> recv_types;
  std::function<void()> on_success;   // post-processing (avg, copies)
  std::vector<char> scratch;          // per-op staging (in-place reduce-scatter)
  std::vector<MPI_Status> statuses;

  void FailNow(absl::Status s) {
    done_ = true;
    status_ = std::move(s);
  }

  bool Poll() override {
    std::lock_guard<std::mutex> l(st_->rt->mu);
    return PollLocked(true);
  }

  absl::Status Wait(absl::Duration timeout) override {
    absl::Time until = absl::Now() + timeout;
    for (int spins = 1;; ++spins) {
      {
        std::lock_guard<std::mutex> l(st_->rt->mu);
        // Reading the clock costs more than an MPI_Testall: do it every 64th.
        if (PollLocked((spins & 63) == 0)) return status_;
      }
      if ((spins & 63) == 0 && absl::Now() >= until) {
        return absl::DeadlineExceededError(absl::StrCat(
            desc_, " did not finish within ", absl::FormatDuration(timeout),
            " of waiting (the operation's own limit is ", absl::FormatDuration(timeout_), ")"));
      }
      if (spins > 256) sched_yield();
    }
  }
  absl::Status Wait() override {
    return Wait(timeout_ + std::max(absl::Seconds(5), timeout_ / 10));
  }
  std::string Describe() const override { return desc_; }

 private:
  bool PollLocked(bool check_deadline) {
    if (done_) return true;
    if (!st_->aborted.ok()) {
      FailNow(absl::FailedPreconditionError(absl::StrCat(
          desc_, ": the communicator was aborted by an earlier error: ", st_->aborted.message())));
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
      FailNow(absl::InternalError(absl::StrCat(desc_, ": MPI error: ", detail)));
      st_->aborted = status_;
      st_->rt->poisoned = true;
      return true;
    }
    if (flag) {
      for (size_t i = 0; i < expect_elems.size(); ++i) {
        if (expect_elems[i] < 0) continue;
        int got = 0;
        MPI_Get_count(&statuses[i], recv_types[i], &got);
        if (got != expect_elems[i]) {
          FailNow(absl::InvalidArgumentError(
              absl::StrCat(desc_, ": received ", got, " elements from rank ",
                           statuses[i].MPI_SOURCE, ", expected ", expect_elems[i],
                           " (element counts differ across ranks)")));
          return true;
        }
      }
      if (on_success) on_success();
      done_ = true;
      return true;
    }
    if (check_deadline && absl::Now() >= deadline_) {
      FailNow(absl::DeadlineExceededError(absl::StrCat(
          desc_, " timed out after ", absl::FormatDuration(timeout_),
          ": ranks that did not arrive: unknown (MPI cannot report which ranks are missing)")));
      st_->aborted = status_;
      st_->rt->poisoned = true;  // pending requests: MPI_Finalize would hang
    }
    return done_;
  }

  std::shared_ptr<CommState> st_;
  std::string desc_;
  absl::Duration timeout_;
  absl::Time deadline_;
  bool done_ = false;
  absl::Status status_;
};

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
    return Issue("all_reduce", in.numel(), [&](MpiWork& w) {
      const void* src = in.raw_data() == out.raw_data() ? MPI_IN_PLACE : in.raw_data();
      w.reqs.resize(1);
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
    return Issue("broadcast", in.numel(), [&](MpiWork& w) {
      if (rank() == root && in.raw_data() != out.raw_data()) {
        std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
      }
      w.reqs.resize(1);
      return MPI_Ibcast(out.raw_data(), static_cast<int>(out.numel()), TypeOf(out.dtype()), root,
                        st_->comm, &w.reqs[0]);
    });
  }

  WorkPtr Reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root) override {
    if (auto s = internal::CheckReduce(in, out, root, size(), device()); !s.ok()) {
      return Fail("reduce", s);
    }
    return Issue("reduce", in.numel(), [&](MpiWork& w) {
      const bool at_root = rank() == root;
      const void* src = at_root && in.raw_data() == out.raw_data() ? MPI_IN_PLACE : in.raw_data();
      w.reqs.resize(1);
      if (at_root) AddAvg(w, out, op);
      return MPI_Ireduce(src, at_root ? out.raw_data() : nullptr, static_cast<int>(in.numel()),
                         TypeOf(in.dtype()), st_->OpFor(in.dtype(), op), root, st_->comm,
                         &w.reqs[0]);
    });
  }

  WorkPtr AllGather(const Tensor& in, const Tensor& out) override {
    if (auto s = internal::CheckAllGather(in, out, rank(), size(), device()); !s.ok()) {
      return Fail("all_gather", s);
    }
    return Issue("all_gather", out.numel(), [&](MpiWork& w) {
      char* slot = static_cast<char*>(out.raw_data()) + rank() * in.nbytes();
      const void* src = in.raw_data() == slot ? MPI_IN_PLACE : in.raw_data();
      w.reqs.resize(1);
      MPI_Datatype t = TypeOf(in.dtype());
      int n = static_cast<int>(in.numel());
      return MPI_Iallgather(src, n, t, out.raw_data(), n, t, st_->comm, &w.reqs[0]);
    });
  }

  WorkPtr ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    if (auto s = internal::CheckReduceScatter(in, out, rank(), size(), device()); !s.ok()) {
      return Fail("reduce_scatter", s);
    }
    return Issue("reduce_scatter", in.numel(), [&](MpiWork& w) {
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
      w.reqs.resize(1);
      return MPI_Ireduce_scatter_block(in.raw_data(), dst, static_cast<int>(out.numel()),
                                       TypeOf(in.dtype()), st_->OpFor(in.dtype(), op), st_->comm,
                                       &w.reqs[0]);
    });
  }

  WorkPtr AllToAll(const Tensor& in, const Tensor& out) override {
    if (auto s = internal::CheckAllToAll(in, out, size(), device()); !s.ok()) {
      return Fail("all_to_all", s);
    }
    return Issue("all_to_all", in.numel(), [&](MpiWork& w) {
      const void* src = in.raw_data() == out.raw_data() ? MPI_IN_PLACE : in.raw_data();
      int n = static_cast<int>(in.numel() / size());
      MPI_Datatype t = TypeOf(in.dtype());
      w.reqs.resize(1);
      return MPI_Ialltoall(src, n, t, out.raw_data(), n, t, st_->comm, &w.reqs[0]);
    });
  }

  WorkPtr Send(const Tensor& t, int peer, int tag) override {
    if (auto s = internal::CheckP2P("send", t, peer, tag, rank(), size(), device()); !s.ok()) {
      return Fail("send", s);
    }
    return BatchImpl("send", {{P2POp::Kind::kSend, t, peer, tag}});
  }
  WorkPtr Recv(const Tensor& t, int peer, int tag) override {
    if (auto s = internal::CheckP2P("recv", t, peer, tag, rank(), size(), device()); !s.ok()) {
      return Fail("recv", s);
    }
    return BatchImpl("recv", {{P2POp::Kind::kRecv, t, peer, tag}});
  }
  WorkPtr BatchSendRecv(const std::vector<P2POp>& ops) override {
    if (auto s = internal::CheckBatch(ops, rank(), size(), device()); !s.ok()) {
      return Fail("batch_send_recv", s);
    }
    return BatchImpl("batch_send_recv", ops);
  }

  WorkPtr Barrier() override { return BarrierWithin(absl::ZeroDuration()); }
  WorkPtr BarrierWithin(absl::Duration op_timeout) override {
    return Issue(
        "barrier", 0,
        [&](MpiWork& w) {
          w.reqs.resize(1);
          return MPI_Ibarrier(st_->comm, &w.reqs[0]);
        },
        op_timeout);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                       const std::string& name) override {
    std::lock_guard<std::mutex> l(st_->rt->mu);
    if (!st_->aborted.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("split of group '", st_->name,
                                                        "': aborted by an earlier error: ",
                                                        st_->aborted.message()));
    }
    MPI_Comm child;
    int rc = MPI_Comm_split(st_->comm, color < 0 ? MPI_UNDEFINED : color, key, &child);
    if (rc != MPI_SUCCESS) {
      return absl::InternalError(absl::StrCat("split of group '", st_->name, "' into '", name,
                                              "': MPI_Comm_split: ", MpiError(rc)));
    }
    if (child == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new MpiCommunicator(Wrap(st_->rt, child, name, st_->timeout)));
  }

  static std::shared_ptr<CommState> Wrap(std::shared_ptr<Runtime> rt, MPI_Comm comm,
                                         const std::string& name, absl::Duration timeout) {
    auto st = std::make_shared<CommState>();
    st->rt = std::move(rt);
    st->comm = comm;
    st->name = name;
    st->timeout = timeout;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &st->rank);
    MPI_Comm_size(comm, &st->size);
    return st;
  }

 private:
  WorkPtr Fail(const char* what, absl::Status s) {
    return CompletedWork(std::move(s), absl::StrCat(what, " in group '", st_->name, "'"));
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

  // `point_to_point`: numbered in the point-to-point sequence.
  WorkPtr Issue(const char* what, int64_t count, const std::function<int(MpiWork&)>& start,
                absl::Duration op_timeout = absl::ZeroDuration(), bool point_to_point = false) {
    const uint64_t seq = point_to_point ? st_->p2p_seq++ : st_->seq++;
    auto w = std::make_shared<MpiWork>(
        st_,
        absl::StrCat(what, " #", seq, " in group '", st_->name, "' (mpi backend, rank ", rank(),
                     " of ", size(), ")"),
        op_timeout);
    if (count > INT_MAX) {
      w->FailNow(absl::InvalidArgumentError(absl::StrCat(w->Describe(), ": ", count,
                                                         " elements exceed MPI's int count")));
      return w;
    }
    std::lock_guard<std::mutex> l(st_->rt->mu);
    if (!st_->aborted.ok()) {
      w->FailNow(absl::FailedPreconditionError(absl::StrCat(
          w->Describe(), ": the communicator was aborted by an earlier error: ",
          st_->aborted.message())));
      return w;
    }
    int rc = start(*w);
    if (rc != MPI_SUCCESS) {
      w->FailNow(absl::InternalError(absl::StrCat(w->Describe(), ": ", MpiError(rc))));
    }
    return w;
  }

  WorkPtr BatchImpl(const char* what, const std::vector<P2POp>& ops) {
    return Issue(what, 0, [&](MpiWork& w) {
      w.reqs.resize(ops.size());
      w.expect_elems.assign(ops.size(), -1);
      w.recv_types.assign(ops.size(), MPI_BYTE);
      // Receives first, so a batch that sends to and receives from the same
      // peer never waits on itself.
      for (size_t i = 0; i < ops.size(); ++i) {
        const P2POp& p = ops[i];
        if (p.kind != P2POp::Kind::kRecv) continue;
        MPI_Datatype t = TypeOf(p.tensor.dtype());
        if (p.tensor.numel() > INT_MAX) return static_cast<int>(MPI_ERR_COUNT);
        int rc = MPI_Irecv(p.tensor.raw_data(), static_cast<int>(p.tensor.numel()), t, p.peer,
                           p.tag, st_->comm, &w.reqs[i]);
        if (rc != MPI_SUCCESS) return rc;
        w.expect_elems[i] = static_cast<int>(p.tensor.numel());
        w.recv_types[i] = t;
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        const P2POp& p = ops[i];
        if (p.kind != P2POp::Kind::kSend) continue;
        if (p.tensor.numel() > INT_MAX) return static_cast<int>(MPI_ERR_COUNT);
        int rc = MPI_Isend(p.tensor.raw_data(), static_cast<int>(p.tensor.numel()),
                           TypeOf(p.tensor.dtype()), p.peer, p.tag, st_->comm, &w.reqs[i]);
        if (rc != MPI_SUCCESS) return rc;
      }
      return static_cast<int>(MPI_SUCCESS);
    }, absl::ZeroDuration(), /*point_to_point=*/true);
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
  return std::unique_ptr<Communicator>(new MpiCommunicator(
      MpiCommunicator::Wrap(rt, world, options.comm.group_name, options.comm.timeout)));
}

}  // namespace loom::comm::mpi
