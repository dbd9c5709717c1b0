#ifndef LOOM_CORE_CUDA_ATTENTION_H_
#define LOOM_CORE_CUDA_ATTENTION_H_

// GPU twin of core/cpu/attention.h (same qkv layout [s, b, heads, 3, d],
// 1/sqrt(d) scaling, causal mask, `probs` = softmax before dropout, dropout
// mask at the GLOBAL probabilities index, bit-identical to the CPU's).
// Packed documents (dropout.doc_start) as on the CPU, both kernels: the
// table is read on the device from dropout.device_doc_start, else copied
// there from the host table for the call.
// qkv, out, probs, dout, dqkv are f32 or bf16, one dtype; scores and probs
// are stored in that dtype, softmax math is f32.
//
// Implementation: cuBLAS strided-batched GEMMs over the b * heads pairs for
// QKᵀ, PV, dO Vᵀ, dS K, dSᵀ Q and Pᵀ dO (full s x s products: the causal
// upper triangle is computed and then masked), plus fused row kernels for the
// causal softmax (+ dropout) and its backward. Temporaries: with dropout the
// dropped P [b, heads, s, s] (forward and backward); the backward also dS
// [b, heads, s, s]. Asynchronous on the current stream.

#include "absl/status/status.h"
#include "core/cpu/attention.h"
#include "core/cpu/flash_attention.h"
#include "core/tensor.h"

namespace loom::core::cuda {

//   qkv: [s, b, heads * 3 * d]; out: [s, b, heads * d]; probs: [b, heads, s, s]
absl::Status AttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs,
                              const cpu::AttentionDropout& dropout = {});

//   dout: [s, b, heads * d]; qkv, probs: the forward's; dqkv: like qkv, written
absl::Status AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                               int64_t heads, Tensor* dqkv,
                               const cpu::AttentionDropout& dropout = {});

// GPU twin of core/cpu/flash_attention.h (same contract: no s x s buffer,
// lse f32 [b, heads, s], the same dropout mask). qkv, out, dout, dqkv f32 or
// bf16 (one dtype), lse always f32; math in f32. One thread block per
// (query tile, pair) for the forward and dQ, per (key tile, pair) for dK/dV
// (flash_attention.cu; no atomics, deterministic); the backward's only
// temporary is delta = rowsum(dO * O), f32 [b, heads, s]. Head dim <= 256.
absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const cpu::AttentionDropout& dropout = {});
absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const cpu::AttentionDropout& dropout = {});

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_ATTENTION_H_
