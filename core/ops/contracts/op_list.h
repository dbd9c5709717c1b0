#ifndef LOOM_CORE_OPS_CONTRACTS_OP_LIST_H_
#define LOOM_CORE_OPS_CONTRACTS_OP_LIST_H_

// Every kernel core/ops dispatches, once: its name, its table member, its
// return type, the argument whose device picks the implementation, and its
// signature. From this list come the KernelTable members (kernel_table.h),
// the entry points (ops.h, ops.cc), each device's table (core/cpu through
// kernel_table.cc, core/cuda through ops_registration.cc: they register
// cpu::Name and cuda::Name), the kernel timer and the fake test device.
// Adding a kernel is a line here plus its implementations; a device whose
// function's signature differs from the line does not compile.
//
//   X(Name, member, Return, on, (parameters), (arguments))
//
// LOOM_OP_DEFAULT(v) marks a parameter's default: "= v" where ops.h declares
// the entry points, nothing elsewhere (function pointer types take none).
// Shapes and dtypes are documented with the CPU kernel of the same name
// (core/cpu/<kernel>.h); the option structs and shared argument checks are
// options.h, shape_checks.h and attention_checks.h beside this file.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

#ifndef LOOM_OP_DEFAULT
#define LOOM_OP_DEFAULT(...)
#endif

// clang-format off
#define LOOM_KERNEL_OPS(X)                                                                         \
  X(Matmul, matmul, absl::Status, a,                                                               \
    (const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts LOOM_OP_DEFAULT({})),  \
    (a, b, c, opts))                                                                               \
  X(BatchedMatmul, batched_matmul, absl::Status, a,                                                \
    (const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts LOOM_OP_DEFAULT({})),  \
    (a, b, c, opts))                                                                               \
  X(BiasAddForward, bias_add_forward, absl::Status, x,                                             \
    (const Tensor& x, const Tensor& bias, Tensor* out), (x, bias, out))                            \
  X(BiasAddBackward, bias_add_backward, absl::Status, dout,                                        \
    (const Tensor& dout, Tensor* dbias), (dout, dbias))                                            \
  X(GeluForward, gelu_forward, absl::Status, x, (const Tensor& x, Tensor* out), (x, out))          \
  X(GeluBackward, gelu_backward, absl::Status, x,                                                  \
    (const Tensor& x, const Tensor& dout, Tensor* dx), (x, dout, dx))                              \
  X(Add, add, absl::Status, a, (const Tensor& a, const Tensor& b, Tensor* out), (a, b, out))       \
  X(Scale, scale, absl::Status, DerefOrUndefined(x), (float scale, Tensor* x), (scale, x))         \
  X(LayerNormForward, layernorm_forward, absl::Status, x,                                          \
    (const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor* out,             \
     Tensor* mean, Tensor* rstd),                                                                  \
    (x, gamma, beta, eps, out, mean, rstd))                                                        \
  X(LayerNormBackward, layernorm_backward, absl::Status, x,                                        \
    (const Tensor& dout, const Tensor& x, const Tensor& gamma, const Tensor& mean,                 \
     const Tensor& rstd, Tensor* dx, Tensor* dgamma, Tensor* dbeta),                               \
    (dout, x, gamma, mean, rstd, dx, dgamma, dbeta))                                               \
  X(RmsNormForward, rmsnorm_forward, absl::Status, x,                                              \
    (const Tensor& x, const Tensor& gamma, float eps, Tensor* out, Tensor* rstd),                  \
    (x, gamma, eps, out, rstd))                                                                    \
  X(RmsNormBackward, rmsnorm_backward, absl::Status, x,                                            \
    (const Tensor& dout, const Tensor& x, const Tensor& gamma, const Tensor& rstd, Tensor* dx,     \
     Tensor* dgamma),                                                                              \
    (dout, x, gamma, rstd, dx, dgamma))                                                            \
  X(RopeForward, rope_forward, absl::Status, x,                                                    \
    (const Tensor& x, const RopeOptions& o, Tensor* out), (x, o, out))                             \
  X(RopeBackward, rope_backward, absl::Status, dout,                                               \
    (const Tensor& dout, const RopeOptions& o, Tensor* dx), (dout, o, dx))                         \
  X(SwigluForward, swiglu_forward, absl::Status, x, (const Tensor& x, Tensor* out), (x, out))      \
  X(SwigluBackward, swiglu_backward, absl::Status, x,                                              \
    (const Tensor& dout, const Tensor& x, Tensor* dx), (dout, x, dx))                              \
  X(SoftmaxForward, softmax_forward, absl::Status, x, (const Tensor& x, Tensor* out), (x, out))    \
  X(SoftmaxBackward, softmax_backward, absl::Status, out,                                          \
    (const Tensor& out, const Tensor& dout, Tensor* dx), (out, dout, dx))                          \
  X(DropoutForward, dropout_forward, absl::Status, x,                                              \
    (const Tensor& x, Tensor* out, const DropoutOptions& opts,                                     \
     const GlobalIndex& where LOOM_OP_DEFAULT({}), Tensor* mask LOOM_OP_DEFAULT(nullptr)),         \
    (x, out, opts, where, mask))                                                                   \
  X(DropoutBackward, dropout_backward, absl::Status, dout,                                         \
    (const Tensor& dout, Tensor* dx, const DropoutOptions& opts,                                   \
     const GlobalIndex& where LOOM_OP_DEFAULT({})),                                                \
    (dout, dx, opts, where))                                                                       \
  /* Causal attention keeping the s x s probabilities (the reference kernel). */                   \
  X(AttentionForward, attention_forward, absl::Status, qkv,                                        \
    (const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs,                                 \
     const AttentionDropout& dropout LOOM_OP_DEFAULT({})),                                         \
    (qkv, heads, out, probs, dropout))                                                             \
  X(AttentionBackward, attention_backward, absl::Status, qkv,                                      \
    (const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads, Tensor* dqkv,      \
     const AttentionDropout& dropout LOOM_OP_DEFAULT({})),                                         \
    (dout, qkv, probs, heads, dqkv, dropout))                                                      \
  /* The same attention keeping the log-sum-exp per row [b, heads, s] (f32). */                    \
  X(FlashAttentionForward, flash_attention_forward, absl::Status, qkv,                             \
    (const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,                                   \
     const AttentionDropout& dropout LOOM_OP_DEFAULT({})),                                         \
    (qkv, heads, out, lse, dropout))                                                               \
  X(FlashAttentionBackward, flash_attention_backward, absl::Status, qkv,                           \
    (const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t heads,   \
     Tensor* dqkv, const AttentionDropout& dropout LOOM_OP_DEFAULT({})),                           \
    (dout, qkv, out, lse, heads, dqkv, dropout))                                                   \
  X(CrossEntropyForward, cross_entropy_forward, absl::StatusOr<double>, logits,                    \
    (const Tensor& logits, const Tensor& targets, Tensor* losses, Tensor* lse,                     \
     const CrossEntropyOptions& opts LOOM_OP_DEFAULT({})),                                         \
    (logits, targets, losses, lse, opts))                                                          \
  X(CrossEntropyBackward, cross_entropy_backward, absl::Status, logits,                            \
    (const Tensor& logits, const Tensor& targets, const Tensor& lse, float dloss, Tensor* dlogits, \
     const CrossEntropyOptions& opts LOOM_OP_DEFAULT({})),                                         \
    (logits, targets, lse, dloss, dlogits, opts))                                                  \
  X(VocabShardRowMax, vocab_shard_row_max, absl::Status, logits,                                   \
    (const Tensor& logits, const VocabShard& shard, Tensor* max), (logits, shard, max))            \
  X(VocabShardSumExp, vocab_shard_sum_exp, absl::Status, logits,                                   \
    (const Tensor& logits, const Tensor& targets, const Tensor& max, const VocabShard& shard,      \
     Tensor* sums),                                                                                \
    (logits, targets, max, shard, sums))                                                           \
  X(VocabShardCrossEntropyBackward, vocab_shard_cross_entropy_backward, absl::Status, logits,      \
    (const Tensor& logits, const Tensor& targets, const Tensor& max, const Tensor& sum,            \
     const VocabShard& shard, float scale, Tensor* dlogits),                                       \
    (logits, targets, max, sum, shard, scale, dlogits))                                            \
  X(EmbeddingForward, embedding_forward, absl::Status, table,                                      \
    (const Tensor& ids, const Tensor& table, Tensor* out,                                          \
     const EmbeddingOptions& opts LOOM_OP_DEFAULT({})),                                            \
    (ids, table, out, opts))                                                                       \
  X(EmbeddingBackward, embedding_backward, absl::Status, dout,                                     \
    (const Tensor& ids, const Tensor& dout, Tensor* dtable,                                        \
     const EmbeddingOptions& opts LOOM_OP_DEFAULT({})),                                            \
    (ids, dout, dtable, opts))                                                                     \
  X(Convert, convert, absl::Status, src, (const Tensor& src, Tensor* dst), (src, dst))             \
  X(Sum, sum, absl::StatusOr<double>, x, (const Tensor& x), (x))                                   \
  X(SumSquares, sum_squares, absl::StatusOr<double>, x, (const Tensor& x), (x))                    \
  /* acc[0] += SumSquares(x) on x's device (acc f64 [1] there): no host wait per call. */          \
  X(SumSquaresInto, sum_squares_into, absl::Status, x, (const Tensor& x, Tensor* acc), (x, acc))   \
  X(AdamWStep, adamw_step, absl::Status, grad,                                                     \
    (Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,                        \
     const AdamWOptions& opts),                                                                    \
    (param, grad, m, v, step, opts))                                                               \
  /* AdamWStep that also writes the bf16 compute copy of the updated range. */                     \
  X(AdamWStepWithCopy, adamw_step_with_copy, absl::Status, grad,                                   \
    (Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,                        \
     const AdamWOptions& opts, Tensor* param_copy),                                                \
    (param, grad, m, v, step, opts, param_copy))                                                   \
  /* The vocab-parallel cross-entropy's local max and sums in one read of the logits, and the */   \
  /* rescaling of those sums to the global max (the "online" cross_entropy). */                    \
  X(VocabShardRowMaxSumExp, vocab_shard_row_max_sum_exp, absl::Status, logits,                     \
    (const Tensor& logits, const Tensor& targets, const VocabShard& shard, Tensor* max,            \
     Tensor* sums),                                                                                \
    (logits, targets, shard, max, sums))                                                           \
  X(VocabShardRescaleSums, vocab_shard_rescale_sums, absl::Status, logits,                         \
    (const Tensor& logits, const Tensor& targets, const Tensor& local_max, const Tensor& max,      \
     const VocabShard& shard, Tensor* sums),                                                       \
    (logits, targets, local_max, max, shard, sums))                                                \
  /* A linear layer's GEMMs with their epilogues (cuBLASLt's bias, GELU keeping its input, */      \
  /* dGELU with the bias gradient, the weight gradient with the bias gradient; */                  \
  /* core/cpu/linear.h). */                                                                        \
  X(LinearForward, linear_forward, absl::Status, x,                                                \
    (const Tensor& x, const Tensor& w, const Tensor& bias, Tensor* y, Tensor* pre,                 \
     const LinearOptions& opts),                                                                   \
    (x, w, bias, y, pre, opts))                                                                    \
  X(LinearBackwardData, linear_backward_data, absl::Status, dy,                                    \
    (const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor* dx, Tensor* dbias,              \
     const LinearOptions& opts),                                                                   \
    (dy, w, pre, dx, dbias, opts))                                                                 \
  X(LinearBackwardWeight, linear_backward_weight, absl::Status, dy,                                \
    (const Tensor& dy, const Tensor& x, Tensor* dw, Tensor* dbias, const LinearOptions& opts),     \
    (dy, x, dw, dbias, opts))                                                                      \
  /* Attention's projection [s, b, groups * (n + 2) * d] to the kernels' qkv */                    \
  /* [s, b, heads, 3, d] with RoPE, and back (k/v summed per group, no atomics). */                \
  X(QkvSplitRopeForward, qkv_split_rope_forward, absl::Status, proj,                               \
    (const Tensor& proj, const QkvSplitOptions& o, Tensor* qkv), (proj, o, qkv))                   \
  X(QkvSplitRopeBackward, qkv_split_rope_backward, absl::Status, dqkv,                             \
    (const Tensor& dqkv, const QkvSplitOptions& o, Tensor* dproj), (dqkv, o, dproj))               \
  /* The context-parallel ring's flash attention in blocks at global positions */                  \
  /* (core/cpu/flash_block.h): a running softmax state per local row, its */                       \
  /* normalisation, delta = rowsum(dO * O), the block backward accumulating */                     \
  /* dQ and dK/dV (f32), and K/V packed for the ring and back. */                                  \
  X(FlashBlockInit, flash_block_init, absl::Status, DerefOrUndefined(acc),                         \
    (Tensor* acc, Tensor* max, Tensor* sum), (acc, max, sum))                                      \
  X(FlashBlockForward, flash_block_forward, absl::Status, qkv,                                     \
    (const Tensor& qkv, const Tensor& kv, const FlashBlockOptions& o, Tensor* acc, Tensor* max,    \
     Tensor* sum),                                                                                 \
    (qkv, kv, o, acc, max, sum))                                                                   \
  X(FlashBlockFinish, flash_block_finish, absl::Status, acc,                                       \
    (const Tensor& acc, const Tensor& max, const Tensor& sum, Tensor* out, Tensor* lse),           \
    (acc, max, sum, out, lse))                                                                     \
  X(FlashBlockDelta, flash_block_delta, absl::Status, out,                                         \
    (const Tensor& dout, const Tensor& out, int64_t heads, Tensor* delta),                         \
    (dout, out, heads, delta))                                                                     \
  X(FlashBlockBackward, flash_block_backward, absl::Status, qkv,                                   \
    (const Tensor& dout, const Tensor& qkv, const Tensor& kv, const Tensor& lse,                   \
     const Tensor& delta, const FlashBlockOptions& o, Tensor* dqkv, Tensor* dkv),                  \
    (dout, qkv, kv, lse, delta, o, dqkv, dkv))                                                     \
  X(FlashKvPack, flash_kv_pack, absl::Status, qkv,                                                 \
    (const Tensor& qkv, int64_t heads, Tensor* kv), (qkv, heads, kv))                              \
  X(FlashKvUnpack, flash_kv_unpack, absl::Status, dkv,                                             \
    (const Tensor& dkv, int64_t heads, Tensor* dqkv), (dkv, heads, dqkv))                          \
  /* The residual path into the next norm: resid = x + dropout(branch), out = Norm(resid) */       \
  /* keeping mean (LayerNorm) and rstd; back: dx = norm backward(dout) + dresid, */                \
  /* dbranch = dropout backward(dx) (core/cpu/residual_norm.h). */                                 \
  X(ResidualNormForward, residual_norm_forward, absl::Status, x,                                   \
    (const Tensor& x, const Tensor& branch, const Tensor& gamma, const Tensor& beta,               \
     const ResidualNormOptions& o, Tensor* resid, Tensor* out, Tensor* mean, Tensor* rstd),        \
    (x, branch, gamma, beta, o, resid, out, mean, rstd))                                           \
  X(ResidualNormBackward, residual_norm_backward, absl::Status, dout,                              \
    (const Tensor& dout, const Tensor& dresid, const Tensor& resid, const Tensor& gamma,           \
     const Tensor& mean, const Tensor& rstd, const ResidualNormOptions& o, Tensor* dx,             \
     Tensor* dbranch, Tensor* dgamma, Tensor* dbeta),                                              \
    (dout, dresid, resid, gamma, mean, rstd, o, dx, dbranch, dgamma, dbeta))                    \
  /* Mixture of experts (core/cpu/moe.h, contracts/moe_checks.h): the router's top-k with */     \
  /* its statistics, the dispatch layout, token rows to expert order and back (no atomics), */  \
  /* the combine and its backward, the router's backward. */                                     \
  X(MoeRouteTopK, moe_route_topk, absl::Status, logits,                                            \
    (const Tensor& logits, const MoeRouteOptions& o, Tensor* expert, Tensor* prob,                 \
     Tensor* stats),                                                                               \
    (logits, o, expert, prob, stats))                                                              \
  X(MoeRouteLayout, moe_route_layout, absl::Status, expert,                                        \
    (const Tensor& expert, const Tensor& prob, const MoeRouteOptions& o, Tensor* row,              \
     Tensor* row_token),                                                                           \
    (expert, prob, o, row, row_token))                                                             \
  X(MoePermute, moe_permute, absl::Status, x,                                                      \
    (const Tensor& x, const Tensor& row_token, Tensor* out), (x, row_token, out))                  \
  X(MoePermuteBackward, moe_permute_backward, absl::Status, drows,                                 \
    (const Tensor& drows, const Tensor& row, Tensor* dx), (drows, row, dx))                        \
  X(MoeCombineForward, moe_combine_forward, absl::Status, rows,                                    \
    (const Tensor& rows, const Tensor& prob, const Tensor& row, Tensor* y), (rows, prob, row, y))  \
  X(MoeCombineBackward, moe_combine_backward, absl::Status, dy,                                    \
    (const Tensor& dy, const Tensor& rows, const Tensor& prob, const Tensor& row, Tensor* drows,   \
     Tensor* dprob),                                                                               \
    (dy, rows, prob, row, drows, dprob))                                                           \
  X(MoeRouterBackward, moe_router_backward, absl::Status, logits,                                  \
    (const Tensor& logits, const Tensor& expert, const Tensor& prob, const Tensor& dprob,          \
     const Tensor& aux_grad, const MoeRouterBackwardOptions& o, Tensor* dlogits),                  \
    (logits, expert, prob, dprob, aux_grad, o, dlogits))
// clang-format on

namespace loom::core::ops {

// The tensor `t` points to, or an undefined one (whose device is the CPU's):
// the `on` argument of a kernel whose only tensor is an output pointer.
const Tensor& DerefOrUndefined(const Tensor* t);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_OP_LIST_H_
