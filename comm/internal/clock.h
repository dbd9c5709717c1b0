#ifndef LOOM_COMM_INTERNAL_CLOCK_H_
#define LOOM_COMM_INTERNAL_CLOCK_H_

// The clocks the backends read per operation and per wait pass, straight
// from the vDSO: absl::Now() measured 80-100 ns a call on this VM (its
// calibrated-TSC path), clock_gettime 16-25 ns (CLOCK_*_COARSE less).

#include <time.h>

#include <cstdint>

#include "absl/time/time.h"

namespace loom::comm::internal {

// The time, as absl::Now() tells it (the same clock: deadlines mix freely).
inline absl::Time Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return absl::TimeFromTimespec(ts);
}

// A monotonic clock in ns, a few ms coarse: plenty for op timeouts of
// seconds, and cheap enough to read for every op.
inline int64_t CoarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_CLOCK_H_
