#ifndef LOOM_CORE_CPU_CROSS_ENTROPY_H_
#define LOOM_CORE_CPU_CROSS_ENTROPY_H_

// Softmax cross-entropy with logits (mean over tokens), and its fused backward
// that writes dlogits = (softmax - onehot) * dloss / count in one pass.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::CrossEntropyOptions;  // the contract's options (core/ops/contracts/options.h)

// losses[n] = logsumexp(logits[n, :]) - logits[n, targets[n]]; returns the
// mean over non-ignored tokens (0 if all are ignored), computed in double.
//   logits:  f32[N, V] (any rank; rows = numel / V)
//   targets: i32 or i64 [N], each in [0, V) or ignore_index
//   losses:  f32[N], written (0 for ignored tokens)
//   lse:     f32[N], written: logsumexp per row, keep for the backward
absl::StatusOr<double> CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                           Tensor* losses, Tensor* lse,
                                           const CrossEntropyOptions& opts = {});

// dlogits[n, v] = (exp(logits[n, v] - lse[n]) - [v == targets[n]]) * dloss / count,
// where count is the number of non-ignored tokens; zero rows for ignored ones.
// dloss is the gradient of the mean loss (1 for plain training).
//   logits:  f32[N, V]; targets: i32/i64 [N]; lse: f32[N] from the forward
//   dlogits: f32[N, V], written; may alias logits (saves a [N, V] buffer)
absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  float dloss, Tensor* dlogits,
                                  const CrossEntropyOptions& opts = {});

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_CROSS_ENTROPY_H_
