#include "train/device_setup.h"

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

absl::Status CheckDevice(const TrainConfig& config, int ranks_on_this_node) {
  if (config.device != DeviceKind::kCuda) return absl::OkStatus();
#ifdef LOOM_HAVE_CUDA
  absl::StatusOr<int> count = core::cuda::VisibleDeviceCount();
  if (!count.ok()) {
    return absl::Status(count.status().code(),
                        absl::StrCat("--device=cuda: ", count.status().message()));
  }
  // NCCL refuses two ranks on one GPU: say so before it does, by flag name.
  if (ranks_on_this_node > *count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=cuda: ", ranks_on_this_node, " ranks on this node (e.g. --nproc-per-node) but "
        "only ", *count, " GPU(s): one rank per GPU"));
  }
  return absl::OkStatus();
#else
  (void)ranks_on_this_node;
  return absl::FailedPreconditionError(
      "--device=cuda: this binary was built without CUDA (no toolkit was found at build time; "
      "point --repo_env=LOOM_CUDA_PATH at one and rebuild)");
#endif
}

absl::Status SelectDevice(TrainConfig* config, int local_rank, int local_world_size,
                          core::Device comm_device) {
  if (config->device != DeviceKind::kCuda) return absl::OkStatus();
  absl::Status checked = CheckDevice(*config, local_world_size);
  if (!checked.ok()) return checked;
#ifdef LOOM_HAVE_CUDA
  absl::StatusOr<int> count = core::cuda::VisibleDeviceCount();
  if (!count.ok()) return count.status();
  const int index =
      comm_device.type == core::DeviceType::kCUDA ? comm_device.index : local_rank % *count;
  absl::Status s = core::cuda::SetCurrentDevice(index);
  if (!s.ok()) return s;
  config->model.device = core::Device::CUDA(index);
  return absl::OkStatus();
#else
  (void)local_rank;
  (void)comm_device;
  return absl::InternalError("unreachable: CheckDevice fails without CUDA");
#endif
}

}  // namespace loom::train
