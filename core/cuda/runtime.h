#ifndef LOOM_CORE_CUDA_RUNTIME_H_
#define LOOM_CORE_CUDA_RUNTIME_H_

// Device and stream state shared by Loom's CUDA kernels and the NCCL backend.
// Each host thread has a current device (a rank's thread drives one GPU) and,
// per device, one non-blocking compute stream on which every Loom kernel and
// copy is enqueued; communication orders itself after that stream with
// events, so the hot path never synchronises the host.

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::core::cuda {

// Number of CUDA devices; Unavailable (with the CUDA error) when there is no
// GPU or driver.
absl::StatusOr<int> VisibleDeviceCount();

// Makes `device` current for the calling thread (cudaSetDevice); an index out
// of range is InvalidArgument naming the device count.
absl::Status SetCurrentDevice(int device);
int CurrentDevice();  // the calling thread's device (0 until set)

// The calling thread's compute stream on its current device, created on
// first use (cudaStreamNonBlocking) and kept for the thread's lifetime.
absl::StatusOr<cudaStream_t> CurrentStream();
// Replaces it (e.g. with a stream owned by the caller); null restores the
// thread's own stream.
void SetCurrentStream(cudaStream_t stream);

// Waits for everything enqueued on the current stream.
absl::Status SynchronizeCurrentStream();

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_RUNTIME_H_
