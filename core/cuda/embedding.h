#ifndef LOOM_CORE_CUDA_EMBEDDING_H_
#define LOOM_CORE_CUDA_EMBEDDING_H_

// GPU twin of core/cpu/embedding.h. table/out/dout are f32 or bf16 (table
// and out one dtype); dtable is always f32 (accumulated with atomics, so the
// order in which duplicate ids add up varies between runs).
//
// One difference from the CPU: with zero_out_of_range = false the CPU
// rejects an id outside the table with InvalidArgument; checking that here
// would need a host sync, so instead such an id gives a NaN row in the
// forward (impossible to miss) and no gradient in the backward.

#include "absl/status/status.h"
#include "core/cpu/embedding.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   ids: i32/i64 [N]; table: [V, C]; out: N * C elements, last dim C
absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor* out,
                              const cpu::EmbeddingOptions& opts = {});

//   ids: i32/i64 [N]; dout: N * C elements, last dim C; dtable: f32[V, C], accumulated
absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor* dtable,
                               const cpu::EmbeddingOptions& opts = {});

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_EMBEDDING_H_
