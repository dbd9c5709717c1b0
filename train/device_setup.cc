#include "train/device_setup.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

#ifdef LOOM_HAVE_CUDA
#include "core/cuda/runtime.h"
#endif

namespace loom::train {

bool BuiltWithCuda() {
#ifdef LOOM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::Status SelectDevice(TrainConfig* config, int local_rank, core::Device comm_device) {
  if (config->device != "cuda") return absl::OkStatus();
#ifdef LOOM_HAVE_CUDA
  absl::StatusOr<int> count = core::cuda::VisibleDeviceCount();
  if (!count.ok()) {
    return absl::Status(count.status().code(),
                        absl::StrCat("--device=cuda: ", count.status().message()));
  }
  // NCCL refuses two ranks on one GPU: say so before it does, by flag name.
  for (const char* var : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) > *count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--device=cuda: ", std::atoi(v), " ranks on this node (", var, ", e.g. from "
          "--nproc-per-node) but only ", *count, " GPU(s): one rank per GPU"));
    }
  }
  const int index =
      comm_device.type == core::DeviceType::kCUDA ? comm_device.index : local_rank % *count;
  absl::Status s = core::cuda::SetCurrentDevice(index);
  if (!s.ok()) return s;
  config->model.device = core::Device::CUDA(index);
  return absl::OkStatus();
#else
  (void)local_rank;
  (void)comm_device;
  return absl::FailedPreconditionError(
      "--device=cuda: this binary was built without CUDA (no toolkit was found at build time; "
      "point --repo_env=LOOM_CUDA_PATH at one and rebuild)");
#endif
}

}  // namespace loom::train
