#ifndef LOOM_CORE_OPS_OPS_H_
#define LOOM_CORE_OPS_OPS_H_

// Device-independent kernels: each call runs the implementation registered
// for the device its tensors live on (see kernel_table.h). Arguments and
// contracts are exactly those of the core/cpu kernel of the same name; on a
// GPU the call is asynchronous on the thread's compute stream, except where
// it returns a host value (CrossEntropyForward, Sum, SumSquares), which
// waits. Layers, the pipeline and the trainer call these, never core/cpu.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/kernel_table.h"
#include "core/tensor.h"

namespace loom::core::ops {

using cpu::AdamWOptions;
using cpu::AttentionDropout;
using cpu::CrossEntropyOptions;
using cpu::DropoutOptions;
using cpu::EmbeddingOptions;
using cpu::GlobalIndex;
using cpu::MatmulOptions;
using cpu::RopeOptions;
using cpu::VocabShard;

// ---- memory (new copies: Tensor::To and Tensor::Clone)
// dst <- src; equal dtype and numel, any two devices, through the device
// side's Allocator::CopyBytes (as Tensor::To).
absl::Status Copy(const Tensor& src, Tensor* dst);
absl::Status Zero(Tensor* t);
// Waits for the work queued on `device` (a no-op on the CPU).
absl::Status Synchronize(Device device);

// ---- kernels (see the core/cpu header of the same name)
absl::Status Matmul(const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts = {});
absl::Status BatchedMatmul(const Tensor& a, const Tensor& b, Tensor* c,
                           const MatmulOptions& opts = {});
absl::Status BiasAddForward(const Tensor& x, const Tensor& bias, Tensor* out);
absl::Status BiasAddBackward(const Tensor& dout, Tensor* dbias);
absl::Status GeluForward(const Tensor& x, Tensor* out);
absl::Status GeluBackward(const Tensor& x, const Tensor& dout, Tensor* dx);
absl::Status Add(const Tensor& a, const Tensor& b, Tensor* out);
absl::Status Scale(float scale, Tensor* x);
absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd);
absl::Status LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta);
absl::Status RmsNormForward(const Tensor& x, const Tensor& gamma, float eps, Tensor* out,
                            Tensor* rstd);
absl::Status RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                             const Tensor& rstd, Tensor* dx, Tensor* dgamma);
absl::Status RopeForward(const Tensor& x, const RopeOptions& o, Tensor* out);
absl::Status RopeBackward(const Tensor& dout, const RopeOptions& o, Tensor* dx);
absl::Status SwigluForward(const Tensor& x, Tensor* out);
absl::Status SwigluBackward(const Tensor& dout, const Tensor& x, Tensor* dx);
absl::Status SoftmaxForward(const Tensor& x, Tensor* out);
absl::Status SoftmaxBackward(const Tensor& out, const Tensor& dout, Tensor* dx);
absl::Status DropoutForward(const Tensor& x, Tensor* out, const DropoutOptions& opts,
                            const GlobalIndex& where = {}, Tensor* mask = nullptr);
absl::Status DropoutBackward(const Tensor& dout, Tensor* dx, const DropoutOptions& opts,
                             const GlobalIndex& where = {});
absl::Status AttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs,
                              const AttentionDropout& dropout = {});
absl::Status AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                               int64_t heads, Tensor* dqkv, const AttentionDropout& dropout = {});
// The same attention without the s x s probabilities (core/cpu/flash_attention.h):
// the forward keeps out and lse [b, heads, s] (f32 on every device) for the backward.
absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const AttentionDropout& dropout = {});
absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const AttentionDropout& dropout = {});
absl::StatusOr<double> CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                           Tensor* losses, Tensor* lse,
                                           const CrossEntropyOptions& opts = {});
absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  float dloss, Tensor* dlogits,
                                  const CrossEntropyOptions& opts = {});
absl::Status VocabShardRowMax(const Tensor& logits, const VocabShard& shard, Tensor* max);
absl::Status VocabShardSumExp(const Tensor& logits, const Tensor& targets, const Tensor& max,
                              const VocabShard& shard, Tensor* sums);
absl::Status VocabShardCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                            const Tensor& max, const Tensor& sum,
                                            const VocabShard& shard, float scale,
                                            Tensor* dlogits);
absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor* out,
                              const EmbeddingOptions& opts = {});
absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor* dtable,
                               const EmbeddingOptions& opts = {});
absl::Status Convert(const Tensor& src, Tensor* dst);
absl::StatusOr<double> Sum(const Tensor& x);
absl::StatusOr<double> SumSquares(const Tensor& x);
absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const AdamWOptions& opts);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_OPS_H_
