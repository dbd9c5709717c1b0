#include "core/cuda/copy.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda {
namespace {

// A CUDA tensor must live on the thread's current device: its stream is
// where the copy is enqueued.
absl::Status CheckCurrent(const char* op, const char* arg, const Tensor& t) {
  if (t.device().type == DeviceType::kCUDA && t.device().index != CurrentDevice()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", arg, " is ", t.DebugString(), " but the calling thread's current device is cuda:",
        CurrentDevice(), " (call SetCurrentDevice first)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> ToDevice(const Tensor& host, int device) {
  if (!host.defined()) return absl::InvalidArgumentError("ToDevice: host is undefined");
  if (!host.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ToDevice: host is ", host.DebugString(), ", expected a CPU tensor"));
  }
  if (device != CurrentDevice()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ToDevice: target cuda:", device, " is not the calling thread's current device cuda:",
        CurrentDevice(), " (call SetCurrentDevice first)"));
  }
  absl::StatusOr<cudaStream_t> stream = CurrentStream();
  if (!stream.ok()) return stream.status();
  absl::StatusOr<Tensor> out = Tensor::Empty(host.shape(), host.dtype(), Device::CUDA(device));
  if (!out.ok()) return out.status();
  if (host.nbytes() > 0) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->raw_data(), host.raw_data(), host.nbytes(),
                                              cudaMemcpyHostToDevice, *stream));
  }
  return out;
}

absl::StatusOr<Tensor> ToHost(const Tensor& t) {
  if (!t.defined()) return absl::InvalidArgumentError("ToHost: t is undefined");
  if (absl::Status s = CheckCurrent("ToHost", "t", t); !s.ok()) return s;
  absl::StatusOr<Tensor> out = Tensor::Empty(t.shape(), t.dtype());
  if (!out.ok()) return out.status();
  if (absl::Status s = CopyTensor(t, &*out); !s.ok()) return s;
  if (!t.device().is_cpu()) {
    if (absl::Status s = SynchronizeCurrentStream(); !s.ok()) return s;
  }
  return out;
}

absl::Status CopyTensor(const Tensor& src, Tensor* dst) {
  constexpr const char* kOp = "CopyTensor";
  if (!src.defined()) return absl::InvalidArgumentError("CopyTensor: src is undefined");
  if (dst == nullptr || !dst->defined()) {
    return absl::InvalidArgumentError("CopyTensor: dst is null or undefined (the caller allocates it)");
  }
  if (src.dtype() != dst->dtype() || src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": src ", src.DebugString(), " and dst ",
                                                   dst->DebugString(),
                                                   " need the same dtype and element count"));
  }
  if (absl::Status s = CheckCurrent(kOp, "src", src); !s.ok()) return s;
  if (absl::Status s = CheckCurrent(kOp, "dst", *dst); !s.ok()) return s;
  if (src.nbytes() == 0) return absl::OkStatus();
  if (src.device().is_cpu() && dst->device().is_cpu()) {
    std::memmove(dst->raw_data(), src.raw_data(), src.nbytes());
    return absl::OkStatus();
  }
  absl::StatusOr<cudaStream_t> stream = CurrentStream();
  if (!stream.ok()) return stream.status();
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->raw_data(), src.raw_data(), src.nbytes(),
                                            cudaMemcpyDefault, *stream));
  return absl::OkStatus();
}

absl::Status FillBytes(Tensor* t, unsigned char byte) {
  if (t == nullptr || !t->defined()) {
    return absl::InvalidArgumentError("FillBytes: t is null or undefined");
  }
  if (t->device().is_cpu()) {
    std::memset(t->raw_data(), byte, t->nbytes());
    return absl::OkStatus();
  }
  if (absl::Status s = CheckCurrent("FillBytes", "t", *t); !s.ok()) return s;
  if (t->nbytes() == 0) return absl::OkStatus();
  absl::StatusOr<cudaStream_t> stream = CurrentStream();
  if (!stream.ok()) return stream.status();
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t->raw_data(), byte, t->nbytes(), *stream));
  return absl::OkStatus();
}

absl::Status ZeroTensor(Tensor* t) { return FillBytes(t, 0); }

}  // namespace loom::core::cuda
