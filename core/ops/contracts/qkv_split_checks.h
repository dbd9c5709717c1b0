#ifndef LOOM_CORE_OPS_CONTRACTS_QKV_SPLIT_CHECKS_H_
#define LOOM_CORE_OPS_CONTRACTS_QKV_SPLIT_CHECKS_H_

// The argument contract of QkvSplitRopeForward / QkvSplitRopeBackward
// (options.h: QkvSplitOptions), shared by every device so a bad argument gets
// the same InvalidArgument everywhere. Shapes and options only; dtypes and
// placement are each device's.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::ops {

struct QkvSplitDims {
  int64_t s, b;       // sequence and batch (dims 0 and 1 of both tensors)
  int64_t heads, groups, n;  // n = heads / groups query heads per K/V head
  int64_t d;          // head dim
  int64_t r;          // rotary dim (0 without rope)
};

// `proj` (the projection, or its gradient) is [S, B, groups * (n + 2) * d]
// with d > 0; `qkv` (the kernel layout, or its gradient) is
// [S, B, heads * 3 * d]; heads > 0 and a multiple of groups. With rope: base
// finite and > 0, rotary_dim 0 (then d must be even) or even in (0, d],
// position_offset >= 0.
absl::StatusOr<QkvSplitDims> CheckQkvSplitArgs(const char* op, const char* proj_name,
                                               const Tensor& proj, const char* qkv_name,
                                               const Tensor& qkv, const QkvSplitOptions& o);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_QKV_SPLIT_CHECKS_H_
