#ifndef LOOM_CORE_OPS_OPS_H_
#define LOOM_CORE_OPS_OPS_H_

// Device-independent kernels: each call runs the implementation registered
// for the device its tensors live on (see kernel_table.h). One entry point per
// line of the op list (contracts/op_list.h), declared from it below: the
// signatures, option structs and argument checks are core/ops's contracts
// (contracts/), and shapes are documented with the CPU kernel of the same name
// (core/cpu/<kernel>.h). On a GPU the call is asynchronous on the thread's
// compute stream, except where it returns a host value (CrossEntropyForward,
// Sum, SumSquares), which waits. Layers, the pipeline and the trainer call
// these, never core/cpu.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/contracts/op_list.h"
#include "core/ops/contracts/options.h"
#include "core/ops/kernel_table.h"
#include "core/tensor.h"

namespace loom::core::ops {

// ---- memory (new copies: Tensor::To and Tensor::Clone)
// dst <- src; equal dtype and numel, any two devices, through the device
// side's Allocator::CopyBytes (as Tensor::To).
absl::Status Copy(const Tensor& src, Tensor* dst);
absl::Status Zero(Tensor* t);
// Waits for the work queued on `device` (a no-op on the CPU).
absl::Status Synchronize(Device device);

// ---- kernels: Matmul, BatchedMatmul, ..., AdamWStep (contracts/op_list.h)
#undef LOOM_OP_DEFAULT
#define LOOM_OP_DEFAULT(...) = __VA_ARGS__
#define LOOM_DECLARE_OP(Name, member, Ret, on, params, args) Ret Name params;
LOOM_KERNEL_OPS(LOOM_DECLARE_OP)
#undef LOOM_DECLARE_OP
#undef LOOM_OP_DEFAULT
#define LOOM_OP_DEFAULT(...)

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_OPS_H_
