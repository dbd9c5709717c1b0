#include "layers/stage_model.h"

#include <algorithm>

#include "comm/comm.h"
#include "core/status_macros.h"

namespace loom::layers {

using core::Shape;
using core::Tensor;

absl::Status UnitObserver::BeforeForward(int64_t) { return absl::OkStatus(); }
absl::Status UnitObserver::AfterForward(int64_t) { return absl::OkStatus(); }
absl::Status UnitObserver::BeforeBackward(int64_t) { return absl::OkStatus(); }
absl::Status UnitObserver::AfterBackward(int64_t) { return absl::OkStatus(); }

void StageModel::AddObserver(UnitObserver* observer) { observers_.push_back(observer); }

absl::StatusOr<Tensor> StageModel::GatherLogits(const Activations&) const {
  return absl::UnimplementedError("GatherLogits: this model family has no vocabulary logits");
}

void StageModel::RemoveObserver(UnitObserver* observer) {
  observers_.erase(std::remove(observers_.begin(), observers_.end(), observer), observers_.end());
}

absl::Status StageModel::Notify(UnitEvent event, int64_t unit) const {
  auto call = [&](UnitObserver* o) {
    switch (event) {
      case UnitEvent::kBeforeForward: return o->BeforeForward(unit);
      case UnitEvent::kAfterForward: return o->AfterForward(unit);
      case UnitEvent::kBeforeBackward: return o->BeforeBackward(unit);
      case UnitEvent::kAfterBackward: return o->AfterBackward(unit);
    }
    return absl::OkStatus();
  };
  const bool before = event == UnitEvent::kBeforeForward || event == UnitEvent::kBeforeBackward;
  if (before) {
    for (UnitObserver* o : observers_) LOOM_RETURN_IF_ERROR(call(o));
  } else {
    for (auto it = observers_.rbegin(); it != observers_.rend(); ++it) {
      LOOM_RETURN_IF_ERROR(call(*it));
    }
  }
  return absl::OkStatus();
}

absl::Status AllReduceSequenceParallelGrads(
    const TpGroup& tp, ParamBuffer* params,
    const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (!tp.sequence_parallel || !tp.parallel()) return absl::OkStatus();
  std::vector<comm::WorkPtr> works;
  for (Param& p : params->params()) {
    if (!p.spec->sequence_parallel_grad) continue;
    const int64_t p_end = p.offset + p.grad.numel();
    for (const auto& [begin, end] : ranges) {
      const int64_t from = std::max(begin, p.offset), to = std::min(end, p_end);
      if (from >= to) continue;
      LOOM_ASSIGN_OR_RETURN(Tensor flat, p.grad.Reshape(Shape{p.grad.numel()}));
      LOOM_ASSIGN_OR_RETURN(Tensor part, flat.Narrow(from - p.offset, to - from));
      works.push_back(tp.comm->AllReduce(part, comm::ReduceOp::kSum));
    }
  }
  return comm::WaitAllOnStream(works);
}

}  // namespace loom::layers
