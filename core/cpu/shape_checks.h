#ifndef LOOM_CORE_CPU_SHAPE_CHECKS_H_
#define LOOM_CORE_CPU_SHAPE_CHECKS_H_

// The kernels' shape contracts, shared by every device's implementation:
// core/cpu defines the contracts and core/cuda checks the same ones, so a
// bad argument gets the same error on every device. Each failure is an
// InvalidArgument naming the op, the argument and its shape. Placement and
// dtype checks stay with each device.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// `t` has exactly the shape `want`.
absl::Status CheckShape(const char* op, const char* name, const Tensor& t, const Shape& want);

// `vec` is rank 1 and as long as x's last dim (a bias; LayerNorm's gamma, beta).
absl::Status CheckLastDimVector(const char* op, const char* x_name, const Tensor& x,
                                const char* vec_name, const Tensor& vec);

// Logits [..., V] with V > 0 and one target per row; returns the row count.
absl::StatusOr<int64_t> CheckLogitsTargets(const char* op, const Tensor& logits,
                                           const Tensor& targets);

// The fused QKV activation [s, b, heads * 3 * d] of attention.
struct AttentionDims {
  int64_t s, b, heads, d;
};
absl::Status CheckQkv(const char* op, const Tensor& qkv, int64_t heads, AttentionDims* dims);

// Attention dropout: p in [0, 1] and this call's heads inside the global ones
// (total_heads 0 means `heads`).
absl::Status CheckAttentionDropout(const char* op, float p, int64_t head_offset,
                                   int64_t total_heads, int64_t heads);

// Dropout of x (rank >= 1): p in [0, 1], first_index >= 0 and row_stride 0
// or at least x's last dim.
absl::Status CheckDropout(const char* op, const Tensor& x, float p, int64_t first_index,
                          int64_t row_stride);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_SHAPE_CHECKS_H_
