#ifndef LOOM_CORE_OPS_KERNEL_TIMER_H_
#define LOOM_CORE_OPS_KERNEL_TIMER_H_

// Where the time of a CPU step goes, kernel by kernel: while a KernelTimer is
// alive, every CPU kernel dispatched through core/ops is timed (wall time of
// the call, OpenMP regions inside it included) and counted, and the GEMMs'
// floating-point operations are summed. What is not inside a kernel (the
// layers' bookkeeping, allocation, the gaps between calls) is the step's time
// minus the sum. For benchmarks: one timer at a time per process; the cost is
// two clock reads per kernel call.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::core::ops {

struct KernelTime {
  std::string kernel;  // the KernelTable member, e.g. "matmul"
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // matmul and batched_matmul: 2·M·N·K per product; others 0
};

class KernelTimer {
 public:
  // FailedPrecondition when another timer is alive.
  static absl::StatusOr<std::unique_ptr<KernelTimer>> Start();
  ~KernelTimer();  // the untimed kernels again
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

  // Every kernel called since Start (or the last Reset), longest first.
  std::vector<KernelTime> Totals() const;
  void Reset();

 private:
  KernelTimer() = default;
};

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_KERNEL_TIMER_H_
