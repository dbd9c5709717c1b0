#ifndef LOOM_CORE_CUDA_COPY_H_
#define LOOM_CORE_CUDA_COPY_H_

// Moving tensors between host and device. Everything is enqueued on the
// calling thread's compute stream (runtime.h) and returns before the copy
// has finished, except ToHost, which waits so the result can be read.
// (Copies from pageable host memory return once the source has been staged,
// so the host tensor may be reused right away; copies INTO pageable host
// memory complete before they return.)

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom::core::cuda {

// A new tensor on cuda:`device` (which must be the calling thread's current
// device) with the contents of the CPU tensor `host`.
absl::StatusOr<Tensor> ToDevice(const Tensor& host, int device);

// A new CPU tensor with the contents of `t` (CPU or CUDA); synchronises the
// current stream.
absl::StatusOr<Tensor> ToHost(const Tensor& t);

// dst = src for any pair of devices (CPU/CUDA); same dtype and numel, shapes
// may differ.
absl::Status CopyTensor(const Tensor& src, Tensor* dst);

// All bytes of `t` set to zero (0.0 for every float dtype).
absl::Status ZeroTensor(Tensor* t);

// All bytes of `t` set to `byte` (tests fill outputs with 0xff = NaN to catch
// elements a kernel forgot to write).
absl::Status FillBytes(Tensor* t, unsigned char byte);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_COPY_H_
