#ifndef LOOM_CORE_CPU_DROPOUT_H_
#define LOOM_CORE_CPU_DROPOUT_H_

// Dropout whose mask depends only on (seed, offset) and each element's index
// in the GLOBAL (unsharded) tensor, through the Philox stream of philox.h
// (DropoutBitsAt: 16 random bits per element; kept iff bits >= ceil(p 2^16)).
// Any parallel layout — a sequence-parallel slice of rows, a tensor-parallel
// slice of columns — draws exactly the mask of its part of the full tensor,
// and the backward regenerates the mask instead of storing it.

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

struct DropoutOptions {
  float p = 0.1f;  // probability of dropping; kept elements are scaled by 1/(1-p)
  uint64_t seed = 0;
  uint64_t offset = 0;  // stream id (e.g. layer and step), see DropoutBitsAt
};

// Where the local tensor sits in the global one. The local tensor is viewed
// as rows of its last dim C; local element (r, c) is global element
//   first_index + r * row_stride + c.
// The whole tensor: {0, C}. Rows [r0, r1) of a [R, C] tensor (sequence
// parallel): {r0 * C, C}. Columns [c0, c0 + C) of a [R, H] tensor (tensor
// parallel): {c0, H}. row_stride = 0 means C (a contiguous slice).
struct GlobalIndex {
  int64_t first_index = 0;
  int64_t row_stride = 0;
};

// out = x * keep / (1 - p), keep = DropoutBitsAt(seed, offset, global index)
// >= DropoutThreshold(p).
//   x, out: f32[..., C], same shape; in-place allowed
//   mask:   optional (nullptr to skip): u8[same numel], written 1 = kept
// p in [0, 1], x of rank >= 1, first_index >= 0 and row_stride 0 or at
// least x's last dim; every device's dropout checks its arguments with this.
absl::Status CheckDropoutArgs(const char* op, const Tensor& x, const DropoutOptions& opts,
                              const GlobalIndex& where);

absl::Status DropoutForward(const Tensor& x, Tensor* out, const DropoutOptions& opts,
                            const GlobalIndex& where = {}, Tensor* mask = nullptr);

// dx = dout * keep / (1 - p), with the mask regenerated from the same
// options and position as the forward.
//   dout, dx: f32[..., C], same shape; in-place allowed
absl::Status DropoutBackward(const Tensor& dout, Tensor* dx, const DropoutOptions& opts,
                             const GlobalIndex& where = {});

namespace internal {
// bits[j] = DropoutBitsAt(seed, offset, first + j) for j < n, with the
// vectorised Philox of DropoutForward. Single-threaded (for kernels that run
// their own threads, e.g. attention dropout).
void DropoutBitsRange(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, uint32_t* bits);
}  // namespace internal

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_DROPOUT_H_
