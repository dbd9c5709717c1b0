#ifndef LOOM_CORE_CUDA_DEVICE_PROBE_H_
#define LOOM_CORE_CUDA_DEVICE_PROBE_H_

#include <vector>

#include "absl/status/statusor.h"

namespace loom::core::cuda {

// Number of usable CUDA devices. Without a GPU or driver: Unavailable, with
// the CUDA error and a hint, never a crash.
absl::StatusOr<int> DeviceCount();

// Runs a trivial kernel writing value + i into n floats and copies them back:
// the smallest end-to-end proof that the built code runs on this GPU.
absl::StatusOr<std::vector<float>> FillIota(int n, float value);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_DEVICE_PROBE_H_
