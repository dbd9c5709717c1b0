#ifndef LOOM_CORE_CUDA_CUDNN_ATTENTION_H_
#define LOOM_CORE_CUDA_CUDNN_ATTENTION_H_

// Causal attention through cuDNN's fused SDPA (cudnn-frontend graphs): the
// vendor-tuned Hopper kernels behind PyTorch SDPA and Transformer Engine.
//
// Contract: Loom's flash attention (core/cpu/flash_attention.h,
// core/cuda/attention.h) — qkv [s, b, heads * 3 * d] ([s, b, heads, {q, k,
// v}, d]), out [s, b, heads * d], lse f32 [b, heads, s] with
// lse[b, h, i] = log sum_{j <= i} exp(q_i·k_j / sqrt(d)) (cuDNN's "Stats",
// natural log, exactly this), causal, scale 1/sqrt(d). Q, K, V, O, dO, dQKV
// are handed to cuDNN by strides (graph_desc.h): no copies.
//
// What it does not do (Unimplemented, with the reason; the caller falls back
// to Loom's own kernel — Supports() says so before any work): dtypes other
// than bf16, attention dropout p > 0 (cuDNN cannot draw Loom's global-index
// Philox mask), head dims that are not multiples of 8 or exceed kMaxHeadDim.
// Packed documents (AttentionDropout::doc_start) are refused too: the SDPA
// graph here has no ragged offsets or per-query key ranges, so the plan runs
// the reference, which takes them (core/cuda/attention.h).
// Malformed arguments are InvalidArgument; all of these come before any
// CUDA or cuDNN call. No libcudnn (loader.h) is FailedPrecondition; a graph
// no cuDNN engine supports on this device is Unimplemented.
//
// The backward uses cuDNN's deterministic algorithm (bitwise-reproducible
// dQ/dK/dV). One graph is built per (device, shape, strides, dtype,
// direction) and cached for the process (thread-safe); each thread has its
// own cuDNN handle per device, bound to Loom's current stream (runtime.h);
// the workspace comes from Loom's caching allocator. Asynchronous on the
// current stream, like every Loom kernel.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cpu/attention.h"  // cpu::AttentionDropout
#include "core/cuda/cudnn/graph_desc.h"  // AttentionShape, Supports, kMaxHeadDim
#include "core/tensor.h"

namespace loom::core::cuda::cudnn {

// ---- Interleaved qkv (Loom's fused QKV projection output), MHA ------------
//   qkv:  bf16[s, b, heads * 3 * d]       out: bf16[s, b, heads * d], written
//   lse:  f32[b, heads, s], written (keep it and out for the backward)
absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const cpu::AttentionDropout& dropout = {});
//   dout: bf16[s, b, heads * d]; qkv, out, lse: the forward's
//   dqkv: bf16[s, b, heads * 3 * d], written (every element)
absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const cpu::AttentionDropout& dropout = {});

// ---- Separate q / k / v, grouped-query attention ---------------------------
// The same graphs with other strides. groups K/V heads, each shared by
// heads / groups consecutive query heads (query head h reads K/V head
// h / (heads / groups)); groups == heads is MHA.
//   q: bf16[s, b, heads * d]; k, v: bf16[s, b, groups * d]
//   out: bf16[s, b, heads * d], written; lse: f32[b, heads, s], written
absl::Status GqaAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v,
                                 int64_t heads, int64_t groups, Tensor* out, Tensor* lse,
                                 const cpu::AttentionDropout& dropout = {});
//   dout: bf16[s, b, heads * d]; q, k, v, out, lse: the forward's
//   dq: like q; dk, dv: like k, v (summed over each group's query heads), written
absl::Status GqaAttentionBackward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  int64_t heads, int64_t groups, Tensor* dq, Tensor* dk,
                                  Tensor* dv, const cpu::AttentionDropout& dropout = {});

// Unimplemented (naming --reset-attention-mask) when the call packs
// documents; checked by Supports' callers and every entry point above.
absl::Status SupportsDocuments(const cpu::AttentionDropout& dropout);

// cudnnGetVersion() of the libcudnn loaded at run time (e.g. 91900), or
// FailedPrecondition naming libcudnn.so.9 and the paths tried.
absl::StatusOr<int64_t> LoadedCudnnVersion();

}  // namespace loom::core::cuda::cudnn

#endif  // LOOM_CORE_CUDA_CUDNN_ATTENTION_H_
