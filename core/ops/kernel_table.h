#ifndef LOOM_CORE_OPS_KERNEL_TABLE_H_
#define LOOM_CORE_OPS_KERNEL_TABLE_H_

// One device's implementations of the kernels core/ops dispatches to, one
// member per line of the op list (contracts/op_list.h). The CPU table is
// built in; a device library (//core/cuda:ops) registers its table when
// linked, so //layers and //train run on a device without depending on its
// toolkit at build time. A device whose signature differs from the op list's
// does not compile.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/ops/contracts/op_list.h"
#include "core/tensor.h"

namespace loom::core::ops {

struct KernelTable {
  const char* name = "";  // "cpu", "cuda"
  // Zero-fills one of this device's tensors. (Copies go through the
  // device's Allocator::CopyBytes: Tensor::To, ops::Copy.)
  absl::Status (*zero)(Tensor* t) = nullptr;
  // Blocks the host until the device has finished the work queued so far.
  absl::Status (*synchronize)() = nullptr;

#define LOOM_TABLE_MEMBER(Name, member, Ret, on, params, args) Ret(*member) params = nullptr;
  LOOM_KERNEL_OPS(LOOM_TABLE_MEMBER)
#undef LOOM_TABLE_MEMBER
};

// A device fills its table from the op list, e.g. for CUDA:
//   #define LOOM_REGISTER(Name, member, ...) t->member = &cuda::Name;
//   LOOM_KERNEL_OPS(LOOM_REGISTER)

// Installs `table` for `type` (kept, not copied; must outlive the process).
// Returns the previous one. Called at start-up by device libraries; for the
// CPU only by wrappers of the built-in table (kernel_timer.h), and nullptr
// restores the built-in one.
const KernelTable* RegisterKernelTable(DeviceType type, const KernelTable* table);

// The CPU kernels built into core/ops.
const KernelTable* BuiltInCpuKernels();

// The table for `device`; FailedPrecondition naming the device and the
// library to link when none is registered.
absl::StatusOr<const KernelTable*> KernelsFor(Device device);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_KERNEL_TABLE_H_
