#ifndef LOOM_COMM_NCCL_DEVICE_MEMORY_H_
#define LOOM_COMM_NCCL_DEVICE_MEMORY_H_

// CUDA tensors for the nccl backend's tests, the conformance binary and the
// benchmark, from //core/cuda's caching allocator.
// Copies run on the calling thread's compute stream for the tensor's device
// (core::cuda::CurrentStream) and synchronise it: test and set-up code only.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/tensor.h"

namespace loom::comm::nccl {

// Number of visible GPUs; Unavailable (with the CUDA error) without one.
absl::StatusOr<int> GpuCount();

// Makes sure //core has a CUDA allocator (//core/cuda's caching one).
void EnsureCudaAllocator();

// An uninitialised tensor on `device` (a CUDA device).
absl::StatusOr<core::Tensor> EmptyOnDevice(const core::Shape& shape, core::DType dtype,
                                           core::Device device);

// Copies between a host and a device tensor of the same byte size; returns
// once the copy is done.
absl::Status CopyToDevice(const core::Tensor& host, const core::Tensor& device);
absl::Status CopyToHost(const core::Tensor& device, const core::Tensor& host);
// Byte ranges: `bytes` at `host_ptr` <-> `dev_ptr` on `device`.
absl::Status CopyBytes(void* dst, const void* src, size_t bytes, bool to_device, int device);
// Within `device` (the benchmark's memcpy reference); returns when done.
absl::Status CopyWithinDevice(void* dst, const void* src, size_t bytes, int device);

}  // namespace loom::comm::nccl

#endif  // LOOM_COMM_NCCL_DEVICE_MEMORY_H_
