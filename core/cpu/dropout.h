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
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// The contract's options (core/ops/contracts/options.h).
using ops::DropoutOptions;
using ops::GlobalIndex;

// out = x * keep / (1 - p), keep = DropoutBitsAt(seed, offset, global index)
// >= DropoutThreshold(p).
//   x, out: f32[..., C], same shape; in-place allowed
//   mask:   optional (nullptr to skip): u8[same numel], written 1 = kept
// Arguments as ops::CheckDropoutArgs (core/ops/contracts/options.h).
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
