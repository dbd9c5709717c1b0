#include "core/cuda/runtime.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "core/cuda/check.h"

namespace loom::core::cuda {

absl::Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                                       cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(
        absl::StrCat(msg, " (this needs an NVIDIA GPU and driver; CPU paths still work)"));
  }
  return absl::InternalError(msg);
}

namespace {

struct ThreadState {
  int device = 0;
  std::map<int, cudaStream_t> own_streams;  // created lazily, one per device
  cudaStream_t override_stream = nullptr;
  // Streams are not destroyed at thread exit: the driver may already be
  // shutting down then, and a process holds only a handful.
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

absl::StatusOr<int> VisibleDeviceCount() {
  int count = 0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (count == 0) return absl::UnavailableError("no CUDA device found (cudaGetDeviceCount = 0)");
  return count;
}

absl::Status SetCurrentDevice(int device) {
  absl::StatusOr<int> count = VisibleDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist: this machine has ", *count,
                     " (valid: 0..", *count - 1, ")"));
  }
  LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  State().device = device;
  return absl::OkStatus();
}

int CurrentDevice() { return State().device; }

absl::StatusOr<cudaStream_t> CurrentStream() {
  ThreadState& s = State();
  if (s.override_stream != nullptr) return s.override_stream;
  auto it = s.own_streams.find(s.device);
  if (it != s.own_streams.end()) return it->second;
  LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(s.device));
  cudaStream_t stream = nullptr;
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  s.own_streams[s.device] = stream;
  return stream;
}

void SetCurrentStream(cudaStream_t stream) { State().override_stream = stream; }

absl::Status SynchronizeCurrentStream() {
  absl::StatusOr<cudaStream_t> stream = CurrentStream();
  if (!stream.ok()) return stream.status();
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(*stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
