#ifndef LOOM_CORE_OPS_KERNEL_TIMER_H_
#define LOOM_CORE_OPS_KERNEL_TIMER_H_

// Where the time of a step goes, kernel by kernel: while a KernelTimer is
// alive, every kernel dispatched through core/ops to its device is timed and
// counted, and the GEMMs' floating-point operations are summed. On the CPU
// the time is the call's wall time (OpenMP regions inside it included); on a
// device it is the device's time between two events recorded on the compute
// stream around the call (the device library's KernelClock: //core/cuda:ops
// registers CUDA events), read when Totals() is called. What is not inside a
// kernel (the layers' bookkeeping, allocation, the gaps between calls) is the
// step's time minus the sum. For benchmarks: one timer at a time per process.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace loom::core::ops {

// How a device times its kernels: a mark before the launch, one after, and
// the device seconds between them (waits for the work; frees the mark).
struct KernelClock {
  void* (*start)() = nullptr;
  void (*stop)(void* mark) = nullptr;
  double (*seconds)(void* mark) = nullptr;
};
// Kept, not copied (null unregisters). Device libraries call it at start-up.
void RegisterKernelClock(DeviceType type, const KernelClock* clock);

struct KernelTime {
  std::string kernel;  // the KernelTable member, e.g. "matmul"
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // GEMMs (matmul, batched_matmul, the linear ops): 2·M·N·K; others 0
};

class KernelTimer {
 public:
  // Times `device`'s kernels. FailedPrecondition when another timer is alive,
  // or when the device has no kernel table or no KernelClock registered.
  static absl::StatusOr<std::unique_ptr<KernelTimer>> Start(DeviceType device = DeviceType::kCPU);
  ~KernelTimer();  // the untimed kernels again
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

  // Every kernel called since Start (or the last Reset), longest first.
  std::vector<KernelTime> Totals() const;
  void Reset();

 private:
  explicit KernelTimer(DeviceType device) : device_(device) {}
  DeviceType device_;
};

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_KERNEL_TIMER_H_
