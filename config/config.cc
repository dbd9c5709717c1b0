#include "config/config.h"

#include "config/finalize.h"
#include "core/status_macros.h"

namespace loom::train {

std::string BackendOf(const TrainConfig& c) {
  if (!c.distributed_backend.empty()) return c.distributed_backend;
  return c.device == DeviceKind::kCuda ? "nccl" : "ucx";
}

// Each step's checks come before the next step's, as one function had them:
// the first error a bad command line meets is the same.
absl::Status Finalize(TrainConfig* c, int world_size) {
  LOOM_RETURN_IF_ERROR(finalize::Launch(c, world_size));
  LOOM_RETURN_IF_ERROR(finalize::Parallelism(c, world_size));
  LOOM_RETURN_IF_ERROR(finalize::Device(c));
  LOOM_RETURN_IF_ERROR(finalize::Batch(c));
  LOOM_RETURN_IF_ERROR(finalize::PipelineSchedule(c));
  LOOM_RETURN_IF_ERROR(finalize::Layout(c));
  LOOM_RETURN_IF_ERROR(finalize::Optimizer(c));
  LOOM_RETURN_IF_ERROR(finalize::Logging(*c));
  LOOM_RETURN_IF_ERROR(finalize::Profile(*c));
  LOOM_RETURN_IF_ERROR(finalize::GradientReduction(*c));
  LOOM_RETURN_IF_ERROR(finalize::Checkpoint(*c));
  LOOM_RETURN_IF_ERROR(finalize::EarlyExit(*c));
  LOOM_RETURN_IF_ERROR(finalize::Straggler(*c));
  LOOM_RETURN_IF_ERROR(finalize::Faults(*c, world_size));
  LOOM_RETURN_IF_ERROR(finalize::Evaluation(*c));
  return finalize::Data(*c);
}

}  // namespace loom::train
