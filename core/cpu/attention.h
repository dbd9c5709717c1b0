#ifndef LOOM_CORE_CPU_ATTENTION_H_
#define LOOM_CORE_CPU_ATTENTION_H_

// Causal multi-head self-attention (the part between the QKV projection and
// the output projection), with GEMMs for QKᵀ and PV over the materialised
// s x s probabilities. The layers use flash_attention.h instead (the same
// contract and dropout mask in O(s·d) memory); this kernel is its reference
// in tests and //core/cpu:attention_bench.
//
// Layout (Megatron's, activations [s, b, h]): the fused QKV projection output
// is f32[s, b, heads * 3 * d], i.e. [s, b, heads, 3, d] — for every head its
// q, k and v vectors side by side. A tensor-parallel rank that owns a
// contiguous range of heads owns a contiguous column slice of the QKV weight
// and passes its local `heads`; nothing else changes. The output is
// f32[s, b, heads * d] ([s, b, heads, d]), the input of the row-parallel
// output projection.
//
// The scores are scaled by 1/sqrt(d); position i attends to positions <= i.
//
// Attention dropout (Megatron's, on the probabilities after the softmax and
// before P·V): O = (P ⊙ keep / (1 - p)) V. The mask is a pure function of
// (seed, offset, global index) through the Philox stream of philox.h with
// DropoutForward's keep rule (DropoutBitsAt(seed, offset, index) >=
// DropoutThreshold(p)), where index is the element's place in the GLOBAL
// probabilities tensor [b, total_heads, s, s]:
//   index = ((b_i * total_heads + head_offset + h_local) * s + i) * s + j,
// so a tensor-parallel rank owning heads [head_offset, head_offset + heads)
// draws exactly its slice of the full mask. `probs` keeps the softmax BEFORE
// dropout (what the softmax backward needs); the backward regenerates the
// mask from the same options instead of storing it.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::AttentionDropout;  // the contract's options (core/ops/contracts/options.h)

//   qkv:   f32[s, b, heads * 3 * d]
//   out:   f32[s, b, heads * d], written
//   probs: f32[b, heads, s, s], written: the softmax probabilities, zero above
//          the diagonal; keep for the backward
//   dropout: see above; pass the same options to the backward
absl::Status AttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs,
                              const AttentionDropout& dropout = {});

//   dout:  f32[s, b, heads * d]
//   qkv:   f32[s, b, heads * 3 * d] (the forward input)
//   probs: f32[b, heads, s, s] from the forward (pre-dropout)
//   dqkv:  f32[s, b, heads * 3 * d], written
//   dropout: the forward's options (the mask is regenerated)
absl::Status AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                               int64_t heads, Tensor* dqkv, const AttentionDropout& dropout = {});

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_ATTENTION_H_
