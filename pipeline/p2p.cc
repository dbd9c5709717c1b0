#include "pipeline/p2p.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace loom::pipeline {

core::Shape BoundaryShape(const layers::GptConfig& config, const layers::TpGroup& tp,
                          int64_t micro_batch_size, int cp) {
  const int64_t local = config.seq_length / cp;  // this CP rank's two chunks
  const int64_t s = tp.sequence_parallel && tp.parallel() ? local / tp.size() : local;
  return core::Shape{s, micro_batch_size, config.hidden_size};
}

int ConsumerVirtualStage(const Action& a, int pp, int pp_rank, bool v_shape) {
  const int own = v_shape ? (a.chunk == 0 ? pp_rank : 2 * pp - 1 - pp_rank)
                          : VirtualStage(pp, pp_rank, a.chunk);
  switch (a.kind) {
    case ActionKind::kSendActivation: return own + 1;
    case ActionKind::kSendGrad: return own - 1;
    default: return own;  // receives (and compute actions) consume on this stage
  }
}

int MessageTag(bool is_grad, int micro_batch, int consumer_virtual_stage, int num_virtual_stages) {
  return (micro_batch * num_virtual_stages + consumer_virtual_stage) * 2 + (is_grad ? 1 : 0);
}

absl::Status CheckTagRange(int micro_batches, int num_virtual_stages) {
  const int64_t needed = static_cast<int64_t>(micro_batches) * num_virtual_stages * 2;
  if (needed > comm::kMaxTag) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline p2p: --micro-batches ", micro_batches, " x ", num_virtual_stages,
        " virtual stages x 2 kinds = ", needed, " message tags, more than the communicator's ",
        comm::kMaxTag, "; use fewer micro-batches per step"));
  }
  return absl::OkStatus();
}

StageP2P::StageP2P(comm::Communicator* pp, int vp, core::Shape boundary, core::DType dtype,
                   core::Device device, bool v_shape)
    : pp_(pp), vp_(vp), boundary_(boundary), dtype_(dtype), device_(device), v_shape_(v_shape) {}

absl::StatusOr<core::Tensor> StageP2P::AllocateBoundary() const {
  return core::Tensor::Empty(boundary_, dtype_, device_);
}

std::string DescribeBatch(const std::vector<StageP2P::Leg>& legs) {
  return absl::StrJoin(legs, ", ", [](std::string* out, const StageP2P::Leg& l) {
    out->append(ToString(l.action));
  });
}

absl::StatusOr<std::unique_ptr<BufferedLinks>> BufferedLinks::Create(comm::Communicator* pp,
                                                                     const Schedule& schedule) {
  auto links = std::make_unique<BufferedLinks>();
  if (pp == nullptr) return links;
  std::set<std::tuple<int, int, bool>> used;  // (sender, receiver, is_grad), the same everywhere
  for (int src = 0; src < static_cast<int>(schedule.stages.size()); ++src) {
    for (const Action& a : schedule.stages[src]) {
      if (IsSend(a.kind)) used.insert({src, a.peer, CarriesGrad(a.kind)});
    }
  }
  const int me = pp->rank();
  for (const auto& [src, dst, is_grad] : used) {
    const bool in = me == src || me == dst;
    LOOM_ASSIGN_OR_RETURN(
        std::unique_ptr<comm::Communicator> c,
        pp->Split(in ? 0 : -1, me == src ? 0 : 1,
                  absl::StrCat("pp ", src, ">", dst, is_grad ? " grads" : " activations")));
    if (in) links->links_[{src, dst, is_grad}] = std::move(c);
  }
  return links;
}

comm::Communicator* BufferedLinks::Link(int src, int dst, bool is_grad) const {
  auto it = links_.find({src, dst, is_grad});
  return it == links_.end() ? nullptr : it->second.get();
}

absl::Status StageP2P::FinishSends() {
  absl::Status first;
  for (PendingSend& p : pending_) {
    absl::Status s = p.work->WaitOnStream();
    if (!s.ok() && first.ok()) {
      first = absl::Status(s.code(), absl::StrCat("stage ", pp_rank(), ": ", p.what, ": ",
                                                  s.message()));
    }
  }
  pending_.clear();
  return first;
}

absl::Status StageP2P::Exchange(const std::vector<Leg>& legs) {
  if (legs.empty()) return absl::OkStatus();
  const int P = pp_size();
  const int me = pp_rank();
  auto fail = [&](absl::Status s) {
    return absl::Status(s.code(),
                        absl::StrCat("stage ", me, ": ", DescribeBatch(legs), ": ", s.message()));
  };
  if (pp_ == nullptr) {
    return fail(absl::FailedPreconditionError(
        "no pipeline communicator (P = 1 has no stage boundaries)"));
  }
  std::vector<comm::P2POp> ops;
  ops.reserve(legs.size());
  for (const Leg& leg : legs) {
    const Action& a = leg.action;
    if (IsCompute(a.kind)) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat(ToString(a), " is not a communication action")));
    }
    if (a.peer < 0 || a.peer >= P) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("peer stage ", a.peer, " outside the pipeline of ", P, " stages")));
    }
    if (!leg.tensor.defined() || leg.tensor.dtype() != dtype_ ||
        leg.tensor.shape() != boundary_) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          ToString(a), ": tensor ", leg.tensor.defined() ? leg.tensor.DebugString() : "(none)",
          ", expected ", core::DTypeName(dtype_), boundary_.ToString(),
          " = [--seq-length (/tp under sequence parallelism), --micro-batch-size, "
          "--hidden-size]")));
    }
    const int consumer = ConsumerVirtualStage(a, P, me, v_shape_);
    comm::P2POp op;
    op.kind = IsSend(a.kind) ? comm::P2POp::Kind::kSend : comm::P2POp::Kind::kRecv;
    op.tensor = leg.tensor;
    op.peer = a.peer;
    op.tag = MessageTag(CarriesGrad(a.kind), a.micro_batch, consumer, P * vp_);
    if (op.tag < 0 || op.tag >= comm::kMaxTag) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("message tag ", op.tag, " outside [0, ", comm::kMaxTag, ")")));
    }
    ops.push_back(std::move(op));
  }
  if (links_ == nullptr) {
    absl::Status s = pp_->BatchSendRecv(ops)->WaitOnStream();
    if (!s.ok()) return fail(s);
    return absl::OkStatus();
  }
  // Buffered: each leg on its own link (rank 0 sends, rank 1 receives); the sends are left
  // in flight, the receives waited for.
  std::vector<comm::WorkPtr> receives;
  for (size_t i = 0; i < legs.size(); ++i) {
    const Action& a = legs[i].action;
    const bool send = IsSend(a.kind);
    comm::Communicator* link = send ? links_->Link(me, a.peer, CarriesGrad(a.kind))
                                    : links_->Link(a.peer, me, CarriesGrad(a.kind));
    if (link == nullptr) {
      return fail(absl::InternalError(
          absl::StrCat(ToString(a), ": the schedule's links (BufferedLinks) have no such link")));
    }
    comm::P2POp op = ops[i];
    op.peer = send ? 1 : 0;
    comm::WorkPtr work = link->BatchSendRecv({op});
    if (send) {
      pending_.push_back({std::move(work), legs[i].tensor, ToString(a)});
    } else {
      receives.push_back(std::move(work));
    }
  }
  for (const comm::WorkPtr& w : receives) {
    absl::Status s = w->WaitOnStream();
    if (!s.ok()) return fail(s);
  }
  // Drop the sends that are done (a failed one reports now).
  std::vector<PendingSend> still;
  for (PendingSend& p : pending_) {
    if (!p.work->Poll()) {
      still.push_back(std::move(p));
      continue;
    }
    absl::Status s = p.work->Wait();
    if (!s.ok()) return fail(absl::Status(s.code(), absl::StrCat(p.what, ": ", s.message())));
  }
  pending_ = std::move(still);
  return absl::OkStatus();
}

}  // namespace loom::pipeline
