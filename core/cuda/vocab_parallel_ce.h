#ifndef LOOM_CORE_CUDA_VOCAB_PARALLEL_CE_H_
#define LOOM_CORE_CUDA_VOCAB_PARALLEL_CE_H_

// GPU twin of core/cpu/vocab_parallel_ce.h: the three local passes of the
// vocab-parallel cross-entropy. logits/dlogits f32 or bf16 (one dtype); max,
// sums and sum always f32; targets i32 or i64. Asynchronous on the current
// stream. Unlike the CPU, targets outside [0, vocab_size) are not reported
// (that would need a host sync per micro-batch): the trainer checks token ids
// on the host before they reach the device.

#include "absl/status/status.h"
#include "core/cpu/vocab_parallel_ce.h"
#include "core/tensor.h"

namespace loom::core::cuda {

absl::Status VocabShardRowMax(const Tensor& logits, const cpu::VocabShard& shard, Tensor* max);
absl::Status VocabShardSumExp(const Tensor& logits, const Tensor& targets, const Tensor& max,
                              const cpu::VocabShard& shard, Tensor* sums);
// The "online" forward's two ops (core/cpu/vocab_parallel_ce.h): one read of
// the logits for the local (max, sums), by an online softmax, and the
// per-row rescaling to the global max. Run by layers/vocab_parallel.cc only
// where core::ops::ChooseKernel("cross_entropy", cuda) picks "online".
absl::Status VocabShardRowMaxSumExp(const Tensor& logits, const Tensor& targets,
                                    const cpu::VocabShard& shard, Tensor* max, Tensor* sums);
absl::Status VocabShardRescaleSums(const Tensor& logits, const Tensor& targets,
                                   const Tensor& local_max, const Tensor& max,
                                   const cpu::VocabShard& shard, Tensor* sums);
absl::Status VocabShardCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                            const Tensor& max, const Tensor& sum,
                                            const cpu::VocabShard& shard, float scale,
                                            Tensor* dlogits);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_VOCAB_PARALLEL_CE_H_
