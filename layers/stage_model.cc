#include "layers/stage_model.h"

#include <algorithm>

#include "comm/comm.h"
#include "core/status_macros.h"

namespace loom::layers {

using core::Shape;
using core::Tensor;

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
