#include "core/cuda/event.h"

#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace loom::core::cuda {
namespace {

absl::StatusOr<cudaStream_t> StreamOrCurrent(cudaStream_t stream) {
  if (stream != nullptr) return stream;
  return CurrentStream();
}

absl::Status NotCreated(const char* what) {
  return absl::FailedPreconditionError(
      std::string("Event::") + what + " on an event that was not made by Event::Create");
}

}  // namespace

absl::StatusOr<Event> Event::Create(bool timing) {
  LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(CurrentDevice()));
  cudaEvent_t e = nullptr;
  LOOM_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return Event(e);
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

absl::Status Event::Record(cudaStream_t stream) {
  if (event_ == nullptr) return NotCreated("Record");
  absl::StatusOr<cudaStream_t> s = StreamOrCurrent(stream);
  if (!s.ok()) return s.status();
  LOOM_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, *s));
  return absl::OkStatus();
}

absl::Status Event::Wait(cudaStream_t stream) const {
  if (event_ == nullptr) return NotCreated("Wait");
  absl::StatusOr<cudaStream_t> s = StreamOrCurrent(stream);
  if (!s.ok()) return s.status();
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(*s, event_, 0));
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Query() const {
  if (event_ == nullptr) return NotCreated("Query");
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) return false;
  LOOM_CUDA_RETURN_IF_ERROR(err);
  return true;
}

absl::Status Event::Synchronize() const {
  if (event_ == nullptr) return NotCreated("Synchronize");
  LOOM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<float> Event::ElapsedMsSince(const Event& start) const {
  if (event_ == nullptr || start.event_ == nullptr) return NotCreated("ElapsedMsSince");
  float ms = 0.0f;
  LOOM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace loom::core::cuda
