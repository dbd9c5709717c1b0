#include "comm/testing/host_staged_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/internal/checks.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::comm::testing {
namespace {

using core::Device;
using core::Tensor;

// Whether two tensors share bytes.
bool Overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || !a.SharesStorageWith(b)) return false;
  const size_t a0 = a.storage_offset_bytes(), b0 = b.storage_offset_bytes();
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// A device tensor and its host copy.
struct Pair {
  Tensor device, host;
};

// The host op's handle. Once the host op is seen complete and ok, it checks
// that no input was changed while the op was in flight, then copies the host
// outputs into the device outputs (once).
class StagedWork : public Work {
 public:
  StagedWork(WorkPtr host, std::vector<Pair> outputs, std::vector<Pair> inputs)
      : host_(std::move(host)), outputs_(std::move(outputs)), inputs_(std::move(inputs)) {}

  bool Poll() override {
    if (!host_->Poll()) return false;
    (void)Land(host_->Wait());
    return true;
  }
  absl::Status Wait(absl::Duration timeout) override { return Land(host_->Wait(timeout)); }
  absl::Status Wait() override { return Land(host_->Wait()); }
  std::string Describe() const override { return host_->Describe(); }

 private:
  absl::Status Land(absl::Status host_status) {
    if (landed_) return landed_status_;
    if (!host_status.ok()) return host_status;
    landed_ = true;
    landed_status_ = LandOutputs();
    outputs_.clear();
    inputs_.clear();
    return landed_status_;
  }
  absl::Status LandOutputs() {
    for (const Pair& in : inputs_) {
      LOOM_ASSIGN_OR_RETURN(Tensor now, in.device.To(Device::CPU()));
      if (std::memcmp(now.raw_data(), in.host.raw_data(), in.host.nbytes()) != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            Describe(), ": an input (", in.device.DebugString(),
            ") was changed before the op completed; on a GPU the collective may read either"));
      }
    }
    for (Pair& out : outputs_) LOOM_RETURN_IF_ERROR(core::ops::Copy(out.host, &out.device));
    return absl::OkStatus();
  }

  WorkPtr host_;
  std::vector<Pair> outputs_;
  std::vector<Pair> inputs_;  // checked unchanged when the op completes
  bool landed_ = false;
  absl::Status landed_status_;
};

// Host copies of one op's device tensors. Issue() fills the device outputs
// with NaN bytes until the op completes: a read before the wait (a race on a
// GPU) reads NaN, not an old value that may happen to be right.
class Stage {
 public:
  // An input: its contents now, checked unchanged when the op completes
  // unless it is also an output (in place) or `read` is false (Broadcast's
  // input off the root, Reduce's output off the root).
  absl::StatusOr<Tensor> In(const Tensor& t, bool read = true) {
    LOOM_ASSIGN_OR_RETURN(Tensor h, t.To(Device::CPU()));
    (read ? inputs_ : unread_).push_back({t, h});
    return h;
  }
  // An output: a host buffer landed into `t` when the op completes.
  absl::StatusOr<Tensor> Out(const Tensor& t) {
    LOOM_ASSIGN_OR_RETURN(Tensor h, Tensor::Empty(t.shape(), t.dtype()));
    outputs_.push_back({t, h});
    return h;
  }
  absl::StatusOr<WorkPtr> Issue(WorkPtr host) {
    std::vector<Pair> checked;
    for (const Pair& in : inputs_) {
      bool in_place = false;
      for (const Pair& out : outputs_) in_place |= Overlap(in.device, out.device);
      if (!in_place) checked.push_back(in);
    }
    for (Pair& out : outputs_) {
      LOOM_ASSIGN_OR_RETURN(Tensor nan, Tensor::Empty(out.device.shape(), out.device.dtype()));
      std::memset(nan.raw_data(), 0xff, nan.nbytes());
      LOOM_RETURN_IF_ERROR(core::ops::Copy(nan, &out.device));
    }
    return std::make_shared<StagedWork>(std::move(host), std::move(outputs_), std::move(checked));
  }

 private:
  std::vector<Pair> outputs_, inputs_, unread_;
};

// One op: `admitted` (its argument check on the device tensors), then
// `issue` on host copies made through a Stage. The host op runs out of place:
// every in-place form gives the same result.
template <typename F>
WorkPtr Staged(const char* what, const absl::Status& admitted, F issue) {
  if (!admitted.ok()) return CompletedWork(admitted, what);
  Stage s;
  absl::StatusOr<WorkPtr> w = issue(s);
  return w.ok() ? *w : CompletedWork(w.status(), what);
}

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(Communicator* host, Device device)
    : host_(host), device_(device) {}

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> host, Device device)
    : owned_(std::move(host)), host_(owned_.get()), device_(device) {}

absl::Status HostStagedCommunicator::Admit(absl::Status checked) {
  if (!aborted_.ok()) return aborted_;
  if (!checked.ok()) {
    aborted_ = absl::FailedPreconditionError(
        absl::StrCat("communicator of group '", group_name(),
                     "' was aborted by an earlier error: ", checked.message()));
  }
  return checked;
}

WorkPtr HostStagedCommunicator::AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) {
  return Staged("all_reduce", Admit(internal::CheckAllReduce(in, out, device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor hin, s.In(in));
                  LOOM_ASSIGN_OR_RETURN(Tensor hout, s.Out(out));
                  return s.Issue(host_->AllReduce(hin, hout, op));
                });
}

WorkPtr HostStagedCommunicator::Broadcast(const Tensor& in, const Tensor& out, int root) {
  return Staged("broadcast", Admit(internal::CheckBroadcast(in, out, root, size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor hin, s.In(in, rank() == root));
                  LOOM_ASSIGN_OR_RETURN(Tensor hout, s.Out(out));
                  return s.Issue(host_->Broadcast(hin, hout, root));
                });
}

WorkPtr HostStagedCommunicator::Reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root) {
  return Staged("reduce", Admit(internal::CheckReduce(in, out, root, size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor hin, s.In(in));
                  // Only root's output is written: elsewhere the device output
                  // keeps its contents.
                  LOOM_ASSIGN_OR_RETURN(Tensor hout,
                                        rank() == root ? s.Out(out) : s.In(out, false));
                  return s.Issue(host_->Reduce(hin, hout, op, root));
                });
}

WorkPtr HostStagedCommunicator::AllGather(const Tensor& in, const Tensor& out) {
  return Staged("all_gather", Admit(internal::CheckAllGather(in, out, rank(), size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor hin, s.In(in));
                  LOOM_ASSIGN_OR_RETURN(Tensor hout, s.Out(out));
                  return s.Issue(host_->AllGather(hin, hout));
                });
}

WorkPtr HostStagedCommunicator::ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  return Staged("reduce_scatter",
                Admit(internal::CheckReduceScatter(in, out, rank(), size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor hin, s.In(in));
                  LOOM_ASSIGN_OR_RETURN(Tensor hout, s.Out(out));
                  return s.Issue(host_->ReduceScatter(hin, hout, op));
                });
}

WorkPtr HostStagedCommunicator::AllToAll(const Tensor& in, const Tensor& out) {
  return Staged("all_to_all", Admit(internal::CheckAllToAll(in, out, size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor hin, s.In(in));
                  LOOM_ASSIGN_OR_RETURN(Tensor hout, s.Out(out));
                  return s.Issue(host_->AllToAll(hin, hout));
                });
}

WorkPtr HostStagedCommunicator::AllToAllV(const Tensor& in, const std::vector<int64_t>& send_counts,
                                          const Tensor& out,
                                          const std::vector<int64_t>& recv_counts) {
  return Staged(
      "all_to_all_v",
      Admit(internal::CheckAllToAllV(in, send_counts, out, recv_counts, rank(), size(), device_)),
      [&](Stage& s) -> absl::StatusOr<WorkPtr> {
        LOOM_ASSIGN_OR_RETURN(Tensor hin, s.In(in));
        LOOM_ASSIGN_OR_RETURN(Tensor hout, s.Out(out));
        return s.Issue(host_->AllToAllV(hin, send_counts, hout, recv_counts));
      });
}

WorkPtr HostStagedCommunicator::Send(const Tensor& t, int peer, int tag) {
  return Staged("send", Admit(internal::CheckP2P("send", t, peer, tag, rank(), size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor h, s.In(t));
                  return s.Issue(host_->Send(h, peer, tag));
                });
}

WorkPtr HostStagedCommunicator::Recv(const Tensor& t, int peer, int tag) {
  return Staged("recv", Admit(internal::CheckP2P("recv", t, peer, tag, rank(), size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  LOOM_ASSIGN_OR_RETURN(Tensor h, s.Out(t));
                  return s.Issue(host_->Recv(h, peer, tag));
                });
}

WorkPtr HostStagedCommunicator::BatchSendRecv(const std::vector<P2POp>& ops) {
  return Staged("batch_send_recv", Admit(internal::CheckBatch(ops, rank(), size(), device_)),
                [&](Stage& s) -> absl::StatusOr<WorkPtr> {
                  std::vector<P2POp> host_ops = ops;
                  for (P2POp& op : host_ops) {
                    LOOM_ASSIGN_OR_RETURN(op.tensor, op.kind == P2POp::Kind::kSend
                                                         ? s.In(op.tensor)
                                                         : s.Out(op.tensor));
                  }
                  return s.Issue(host_->BatchSendRecv(host_ops));
                });
}

WorkPtr HostStagedCommunicator::Barrier() {
  if (!aborted_.ok()) return CompletedWork(aborted_, "barrier");
  return host_->Barrier();
}

WorkPtr HostStagedCommunicator::BarrierWithin(absl::Duration op_timeout) {
  if (!aborted_.ok()) return CompletedWork(aborted_, "barrier");
  return host_->BarrierWithin(op_timeout);
}

absl::StatusOr<std::unique_ptr<Communicator>> HostStagedCommunicator::Split(
    int color, int key, const std::string& name) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> child, host_->Split(color, key, name));
  if (child == nullptr) return child;
  return std::unique_ptr<Communicator>(new HostStagedCommunicator(std::move(child), device_));
}

}  // namespace loom::comm::testing
