#include "core/ops/ops.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::core::ops {
namespace {

// Runs table member `fn` of the device `on` lives on.
#define LOOM_OPS_DISPATCH(on, fn, ...)                                       \
  do {                                                                       \
    LOOM_ASSIGN_OR_RETURN(const KernelTable* table_, KernelsFor((on).device())); \
    if (table_->fn == nullptr) return NotInTable(*table_, #fn);              \
    return table_->fn(__VA_ARGS__);                                          \
  } while (0)

// A registered table without the kernel (a device library older than core/ops).
absl::Status NotInTable(const KernelTable& table, const char* fn) {
  return absl::UnimplementedError(
      absl::StrCat("the ", table.name, " kernel table has no ", fn, " kernel"));
}

const Tensor& Deref(const Tensor* t) {
  static const Tensor kUndefined;
  return t != nullptr ? *t : kUndefined;
}

}  // namespace

absl::Status Copy(const Tensor& src, Tensor* dst) {
  if (dst == nullptr || !src.defined() || !dst->defined() || src.dtype() != dst->dtype() ||
      src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Copy: src ", src.defined() ? src.DebugString() : "undefined", " and dst ",
                     dst != nullptr && dst->defined() ? dst->DebugString() : "undefined",
                     ": expected two defined tensors of equal dtype and element count"));
  }
  // The non-CPU side's allocator moves the bytes (the CPU's for two host tensors).
  const Device on = src.device().is_cpu() ? dst->device() : src.device();
  Allocator* allocator = GetAllocator(on.type);
  if (allocator == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("Copy to ", dst->DebugString(), ": no allocator is registered for ",
                     on.ToString()));
  }
  return allocator->CopyBytes(dst->raw_data(), dst->device(), src.raw_data(), src.device(),
                              src.nbytes());
}

absl::Status Zero(Tensor* t) {
  if (t == nullptr || !t->defined()) return absl::InvalidArgumentError("Zero: undefined tensor");
  LOOM_OPS_DISPATCH(*t, zero, t);
}

absl::Status Synchronize(Device device) {
  LOOM_ASSIGN_OR_RETURN(const KernelTable* table, KernelsFor(device));
  return table->synchronize();
}

absl::Status Matmul(const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts) {
  LOOM_OPS_DISPATCH(a, matmul, a, b, c, opts);
}
absl::Status BatchedMatmul(const Tensor& a, const Tensor& b, Tensor* c,
                           const MatmulOptions& opts) {
  LOOM_OPS_DISPATCH(a, batched_matmul, a, b, c, opts);
}
absl::Status BiasAddForward(const Tensor& x, const Tensor& bias, Tensor* out) {
  LOOM_OPS_DISPATCH(x, bias_add_forward, x, bias, out);
}
absl::Status BiasAddBackward(const Tensor& dout, Tensor* dbias) {
  LOOM_OPS_DISPATCH(dout, bias_add_backward, dout, dbias);
}
absl::Status GeluForward(const Tensor& x, Tensor* out) { LOOM_OPS_DISPATCH(x, gelu_forward, x, out); }
absl::Status GeluBackward(const Tensor& x, const Tensor& dout, Tensor* dx) {
  LOOM_OPS_DISPATCH(x, gelu_backward, x, dout, dx);
}
absl::Status Add(const Tensor& a, const Tensor& b, Tensor* out) { LOOM_OPS_DISPATCH(a, add, a, b, out); }
absl::Status Scale(float scale, Tensor* x) { LOOM_OPS_DISPATCH(Deref(x), scale, scale, x); }
absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor* out, Tensor* mean, Tensor* rstd) {
  LOOM_OPS_DISPATCH(x, layernorm_forward, x, gamma, beta, eps, out, mean, rstd);
}
absl::Status LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                               const Tensor& mean, const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta) {
  LOOM_OPS_DISPATCH(x, layernorm_backward, dout, x, gamma, mean, rstd, dx, dgamma, dbeta);
}
absl::Status RmsNormForward(const Tensor& x, const Tensor& gamma, float eps, Tensor* out,
                            Tensor* rstd) {
  LOOM_OPS_DISPATCH(x, rmsnorm_forward, x, gamma, eps, out, rstd);
}
absl::Status RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                             const Tensor& rstd, Tensor* dx, Tensor* dgamma) {
  LOOM_OPS_DISPATCH(x, rmsnorm_backward, dout, x, gamma, rstd, dx, dgamma);
}
absl::Status RopeForward(const Tensor& x, const RopeOptions& o, Tensor* out) {
  LOOM_OPS_DISPATCH(x, rope_forward, x, o, out);
}
absl::Status RopeBackward(const Tensor& dout, const RopeOptions& o, Tensor* dx) {
  LOOM_OPS_DISPATCH(dout, rope_backward, dout, o, dx);
}
absl::Status SwigluForward(const Tensor& x, Tensor* out) {
  LOOM_OPS_DISPATCH(x, swiglu_forward, x, out);
}
absl::Status SwigluBackward(const Tensor& dout, const Tensor& x, Tensor* dx) {
  LOOM_OPS_DISPATCH(x, swiglu_backward, dout, x, dx);
}
absl::Status SoftmaxForward(const Tensor& x, Tensor* out) {
  LOOM_OPS_DISPATCH(x, softmax_forward, x, out);
}
absl::Status SoftmaxBackward(const Tensor& out, const Tensor& dout, Tensor* dx) {
  LOOM_OPS_DISPATCH(out, softmax_backward, out, dout, dx);
}
absl::Status DropoutForward(const Tensor& x, Tensor* out, const DropoutOptions& opts,
                            const GlobalIndex& where, Tensor* mask) {
  LOOM_OPS_DISPATCH(x, dropout_forward, x, out, opts, where, mask);
}
absl::Status DropoutBackward(const Tensor& dout, Tensor* dx, const DropoutOptions& opts,
                             const GlobalIndex& where) {
  LOOM_OPS_DISPATCH(dout, dropout_backward, dout, dx, opts, where);
}
absl::Status AttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs,
                              const AttentionDropout& dropout) {
  LOOM_OPS_DISPATCH(qkv, attention_forward, qkv, heads, out, probs, dropout);
}
absl::Status AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                               int64_t heads, Tensor* dqkv, const AttentionDropout& dropout) {
  LOOM_OPS_DISPATCH(qkv, attention_backward, dout, qkv, probs, heads, dqkv, dropout);
}
absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const AttentionDropout& dropout) {
  LOOM_OPS_DISPATCH(qkv, flash_attention_forward, qkv, heads, out, lse, dropout);
}
absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const AttentionDropout& dropout) {
  LOOM_OPS_DISPATCH(qkv, flash_attention_backward, dout, qkv, out, lse, heads, dqkv, dropout);
}
absl::StatusOr<double> CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                           Tensor* losses, Tensor* lse,
                                           const CrossEntropyOptions& opts) {
  LOOM_OPS_DISPATCH(logits, cross_entropy_forward, logits, targets, losses, lse, opts);
}
absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  float dloss, Tensor* dlogits, const CrossEntropyOptions& opts) {
  LOOM_OPS_DISPATCH(logits, cross_entropy_backward, logits, targets, lse, dloss, dlogits, opts);
}
absl::Status VocabShardRowMax(const Tensor& logits, const VocabShard& shard, Tensor* max) {
  LOOM_OPS_DISPATCH(logits, vocab_shard_row_max, logits, shard, max);
}
absl::Status VocabShardSumExp(const Tensor& logits, const Tensor& targets, const Tensor& max,
                              const VocabShard& shard, Tensor* sums) {
  LOOM_OPS_DISPATCH(logits, vocab_shard_sum_exp, logits, targets, max, shard, sums);
}
absl::Status VocabShardCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                            const Tensor& max, const Tensor& sum,
                                            const VocabShard& shard, float scale,
                                            Tensor* dlogits) {
  LOOM_OPS_DISPATCH(logits, vocab_shard_cross_entropy_backward, logits, targets, max, sum, shard,
                    scale, dlogits);
}
absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor* out,
                              const EmbeddingOptions& opts) {
  LOOM_OPS_DISPATCH(table, embedding_forward, ids, table, out, opts);
}
absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor* dtable,
                               const EmbeddingOptions& opts) {
  LOOM_OPS_DISPATCH(dout, embedding_backward, ids, dout, dtable, opts);
}
absl::Status Convert(const Tensor& src, Tensor* dst) { LOOM_OPS_DISPATCH(src, convert, src, dst); }
absl::StatusOr<double> Sum(const Tensor& x) { LOOM_OPS_DISPATCH(x, sum, x); }
absl::StatusOr<double> SumSquares(const Tensor& x) { LOOM_OPS_DISPATCH(x, sum_squares, x); }
absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const AdamWOptions& opts) {
  LOOM_OPS_DISPATCH(grad, adamw_step, param, grad, m, v, step, opts);
}

#undef LOOM_OPS_DISPATCH

}  // namespace loom::core::ops
