#include "comm/nccl/device_memory.h"

#include <cuda_runtime_api.h>

#include <functional>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/storage.h"

namespace loom::comm::nccl {
absl::StatusOr<int> GpuCount() { return core::cuda::VisibleDeviceCount(); }

void EnsureCudaAllocator() {
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  // //core/cuda's caching allocator registers itself when linked; this only
  // matters if something unregistered it.
  if (core::GetAllocator(core::DeviceType::kCUDA) == nullptr) {
    core::SetAllocator(core::DeviceType::kCUDA, &core::cuda::CachingAllocator::Get());
  }
}

absl::StatusOr<core::Tensor> EmptyOnDevice(const core::Shape& shape, core::DType dtype,
                                           core::Device device) {
  if (device.is_cpu()) {
    return absl::InvalidArgumentError("EmptyOnDevice: the device is cpu, expected a CUDA device");
  }
  EnsureCudaAllocator();
  return core::Tensor::Empty(shape, dtype, device);
}

namespace {

// Runs `copy` on the calling thread's compute stream for `device`, then
// synchronises that stream.
absl::Status OnComputeStream(int device,
                             const std::function<cudaError_t(cudaStream_t)>& copy) {
  const int prev_core = core::cuda::CurrentDevice();
  if (prev_core != device) {
    absl::Status s = core::cuda::SetCurrentDevice(device);
    if (!s.ok()) return s;
  }
  absl::Status result = [&]() -> absl::Status {
    LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    absl::StatusOr<cudaStream_t> stream = core::cuda::CurrentStream();
    if (!stream.ok()) return stream.status();
    LOOM_CUDA_RETURN_IF_ERROR(copy(*stream));
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(*stream));
    return absl::OkStatus();
  }();
  if (prev_core != device) core::cuda::SetCurrentDevice(prev_core).IgnoreError();
  return result;
}

}  // namespace

absl::Status CopyBytes(void* dst, const void* src, size_t bytes, bool to_device, int device) {
  if (bytes == 0) return absl::OkStatus();
  return OnComputeStream(device, [&](cudaStream_t s) {
    return cudaMemcpyAsync(dst, src, bytes,
                           to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s);
  });
}

absl::Status CopyWithinDevice(void* dst, const void* src, size_t bytes, int device) {
  if (bytes == 0) return absl::OkStatus();
  return OnComputeStream(device, [&](cudaStream_t s) {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  });
}

absl::Status CopyToDevice(const core::Tensor& host, const core::Tensor& device) {
  if (!host.device().is_cpu() || device.device().is_cpu() || host.nbytes() != device.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat("CopyToDevice: ", host.DebugString(), " -> ",
                                                   device.DebugString()));
  }
  return CopyBytes(device.raw_data(), host.raw_data(), host.nbytes(), true, device.device().index);
}

absl::Status CopyToHost(const core::Tensor& device, const core::Tensor& host) {
  if (!host.device().is_cpu() || device.device().is_cpu() || host.nbytes() != device.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat("CopyToHost: ", device.DebugString(), " -> ",
                                                   host.DebugString()));
  }
  return CopyBytes(host.raw_data(), device.raw_data(), host.nbytes(), false, device.device().index);
}

}  // namespace loom::comm::nccl
