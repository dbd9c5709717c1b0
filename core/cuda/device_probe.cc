#include "core/cuda/device_probe.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/device_probe_kernels.h"

namespace loom::core::cuda {

absl::StatusOr<int> DeviceCount() {
  char err[256] = {0};
  int count = 0;
  if (loom_cuda_device_count(&count, err, sizeof(err)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no usable CUDA device: ", err,
                     ". This needs a machine with an NVIDIA GPU and driver; CPU paths still work."));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device found (cudaGetDeviceCount = 0)");
  return count;
}

absl::StatusOr<std::vector<float>> FillIota(int n, float value) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("FillIota: n = ", n, ", expected >= 0"));
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) return count.status();
  std::vector<float> out(n);
  char err[256] = {0};
  if (loom_cuda_fill_iota(out.data(), n, value, err, sizeof(err)) != 0) {
    return absl::InternalError(err);
  }
  return out;
}

}  // namespace loom::core::cuda
