#ifndef LOOM_CORE_CPU_VOCAB_PARALLEL_CE_H_
#define LOOM_CORE_CPU_VOCAB_PARALLEL_CE_H_

// The three local passes of Megatron's vocab-parallel cross-entropy. Each TP
// rank holds logits for vocabulary columns [vocab_start, vocab_start + Vp) of
// which the first `valid` are real entries (the rest is padding, ignored).
// Between the passes the caller all-reduces the row maxima (max) and the
// [sum exp, target logit] pairs (sum) over the TP group.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::VocabShard;  // the contract's options (core/ops/contracts/options.h)

// max[i] = max over the valid local columns of logits[i, :] (-inf if none).
//   logits: f32[N, Vp] (any rank; rows = numel / Vp); max: f32[N], written
absl::Status VocabShardRowMax(const Tensor& logits, const VocabShard& shard, Tensor* max);

// sums[0, i] = Σ_valid exp(logits[i, v] - max[i]);
// sums[1, i] = logits[i, t_i - vocab_start] - max[i] if this shard holds the
// target t_i, else 0. OutOfRange names the token whose target is outside
// [0, vocab_size).
//   targets: i32/i64 [N]; max: f32[N] (global); sums: f32[2, N], written
absl::Status VocabShardSumExp(const Tensor& logits, const Tensor& targets, const Tensor& max,
                              const VocabShard& shard, Tensor* sums);

// dlogits[i, v] = (exp(logits[i, v] - max[i]) / sum[i] - [v is the target]) * scale,
// zero on padding columns. sum: f32[N] (global Σ exp). dlogits may alias logits.
// The "online" forward (layers/vocab_parallel.cc): the two local passes in
// one read of the logits. max[i] = this shard's row max (as
// VocabShardRowMax) and sums = VocabShardSumExp(logits, targets, max) for
// that local max. On the CPU each row is reduced twice while it sits in the
// cache (a 50k-column f32 row is 200 KB), so the results are bitwise those
// of the two passes and the logits come from memory once.
//   targets: i32/i64 [N]; max: f32[N], written; sums: f32[2, N], written
absl::Status VocabShardRowMaxSumExp(const Tensor& logits, const Tensor& targets,
                                    const VocabShard& shard, Tensor* max, Tensor* sums);

// Brings a shard's local sums to the global row max before they are summed
// over TP: sums[0, i] *= exp(local_max[i] - max[i]) (in double, rounded once;
// unchanged where the two are equal), sums[1, i] = logits[i, t_i -
// vocab_start] - max[i] where this shard holds the target, else 0 (exactly
// what VocabShardSumExp with the global max writes). Only sums[0] differs
// from the unfused path: by the rounding of its terms' exponentials taken
// against another max (a few f32 ulps).
//   local_max, max: f32[N]; sums: f32[2, N], read and written
absl::Status VocabShardRescaleSums(const Tensor& logits, const Tensor& targets,
                                   const Tensor& local_max, const Tensor& max,
                                   const VocabShard& shard, Tensor* sums);

absl::Status VocabShardCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                            const Tensor& max, const Tensor& sum,
                                            const VocabShard& shard, float scale,
                                            Tensor* dlogits);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_VOCAB_PARALLEL_CE_H_
