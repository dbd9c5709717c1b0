#ifndef LOOM_CORE_CUDA_EVENT_H_
#define LOOM_CORE_CUDA_EVENT_H_

// A cudaEvent_t that destroys itself: orders one stream after another's work
// (Record on the producer, Wait on the consumer) and times kernels.

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::core::cuda {

class Event {
 public:
  // On the calling thread's current device. `timing` = false gives the
  // cheaper event that cannot be used with ElapsedMs.
  static absl::StatusOr<Event> Create(bool timing = false);

  Event() = default;  // holds nothing; Create() makes a usable one
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work enqueued so far on `stream` (null: the current stream).
  absl::Status Record(cudaStream_t stream = nullptr);
  // Makes `stream` (null: the current stream) wait for the recorded work,
  // without blocking the host.
  absl::Status Wait(cudaStream_t stream = nullptr) const;
  // True when the recorded work has finished (never blocks).
  absl::StatusOr<bool> Query() const;
  // Blocks the host until the recorded work has finished.
  absl::Status Synchronize() const;
  // Milliseconds from `start`'s record to this one's (both timing events).
  absl::StatusOr<float> ElapsedMsSince(const Event& start) const;

  cudaEvent_t get() const { return event_; }

 private:
  explicit Event(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_ = nullptr;
};

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_EVENT_H_
