#ifndef LOOM_CORE_CPU_EMBEDDING_H_
#define LOOM_CORE_CPU_EMBEDDING_H_

// Token (or position) embedding lookup and its scatter-add backward.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::EmbeddingOptions;  // the contract's options (core/ops/contracts/options.h)

// out[n, :] = table[ids[n] - vocab_start, :].
//   ids:   i32 or i64 [N] (any shape with N elements, e.g. [s, b])
//   table: f32[V, C]
//   out:   f32[N, C] (any shape with N * C elements whose last dim is C)
absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor* out,
                              const EmbeddingOptions& opts = {});

// dtable[ids[n] - vocab_start, :] += dout[n, :]. Duplicate ids add up.
//   ids:    i32 or i64 [N]
//   dout:   f32[N, C] (as `out` above)
//   dtable: f32[V, C], accumulated
absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor* dtable,
                               const EmbeddingOptions& opts = {});

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_EMBEDDING_H_
