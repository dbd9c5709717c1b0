#include "layers/attention.h"

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::layers {

using core::Shape;
using core::Tensor;

uint64_t DropoutSite(uint64_t stream, int64_t layer, int site) {
  // SplitMix64 finaliser over (stream, layer, site): distinct, well-mixed ids.
  uint64_t z = stream * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(layer + 1) * 0xBF58476D1CE4E5B9ull +
               static_cast<uint64_t>(site) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

core::ops::AttentionDropout ParallelAttention::KernelDropout(const DropoutStream& dropout) const {
  // Site 2 of the layer (sites 0 and 1 are the hidden dropouts). The mask is
  // indexed in the global probs [b, heads_, s, s], so every TP layout draws
  // the same mask as TP=1; the backward regenerates it from the same options.
  const int64_t local_heads = heads_ / tp_.size();
  core::ops::AttentionDropout d;
  d.p = dropout.training ? dropout.attention_p : 0.0f;
  d.seed = dropout.seed;
  d.offset = DropoutSite(dropout.stream, layer_, 2);
  d.head_offset = tp_.rank() * local_heads;
  d.total_heads = heads_;
  return d;
}

absl::StatusOr<Tensor> ParallelAttention::Forward(const Tensor& x, const DropoutStream& dropout,
                                                  Saved* saved) const {
  const int64_t local_heads = heads_ / tp_.size();
  LOOM_ASSIGN_OR_RETURN(saved->qkv, qkv_.Forward(x, &saved->qkv_in));  // [s, b, 3h/p]
  const int64_t s = saved->qkv.dim(0), b = saved->qkv.dim(1);
  const int64_t d = saved->qkv.dim(2) / (3 * local_heads);
  LOOM_ASSIGN_OR_RETURN(Tensor ctx, Tensor::Empty(Shape{s, b, local_heads * d}, saved->qkv.dtype(), saved->qkv.device()));
  LOOM_ASSIGN_OR_RETURN(saved->probs,
                        Tensor::Empty(Shape{b, local_heads, s, s}, saved->qkv.dtype(), saved->qkv.device()));
  LOOM_RETURN_IF_ERROR(core::ops::AttentionForward(saved->qkv, local_heads, &ctx, &saved->probs,
                                                   KernelDropout(dropout)));
  return proj_.Forward(ctx, &saved->proj_in);
}

absl::StatusOr<Tensor> ParallelAttention::Backward(const Tensor& dy, const DropoutStream& dropout,
                                                   const Saved& saved) const {
  const int64_t local_heads = heads_ / tp_.size();
  LOOM_ASSIGN_OR_RETURN(Tensor dctx, proj_.Backward(dy, saved.proj_in));
  LOOM_ASSIGN_OR_RETURN(Tensor dqkv, Tensor::Empty(saved.qkv.shape(), saved.qkv.dtype(), saved.qkv.device()));
  LOOM_RETURN_IF_ERROR(
      core::ops::AttentionBackward(dctx, saved.qkv, saved.probs, local_heads, &dqkv,
                                   KernelDropout(dropout)));
  return qkv_.Backward(dqkv, saved.qkv_in);
}

absl::StatusOr<Tensor> ParallelMlp::Forward(const Tensor& x, Saved* saved) const {
  LOOM_ASSIGN_OR_RETURN(saved->pre_gelu, up_.Forward(x, &saved->up_in));
  LOOM_ASSIGN_OR_RETURN(Tensor act, Tensor::Empty(saved->pre_gelu.shape(), saved->pre_gelu.dtype(), saved->pre_gelu.device()));
  LOOM_RETURN_IF_ERROR(core::ops::GeluForward(saved->pre_gelu, &act));
  return down_.Forward(act, &saved->down_in);
}

absl::StatusOr<Tensor> ParallelMlp::Backward(const Tensor& dy, const Saved& saved) const {
  LOOM_ASSIGN_OR_RETURN(Tensor dact, down_.Backward(dy, saved.down_in));
  LOOM_RETURN_IF_ERROR(core::ops::GeluBackward(saved.pre_gelu, dact, &dact));
  return up_.Backward(dact, saved.up_in);
}

}  // namespace loom::layers
