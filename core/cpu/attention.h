#ifndef LOOM_CORE_CPU_ATTENTION_H_
#define LOOM_CORE_CPU_ATTENTION_H_

// Causal multi-head self-attention (the part between the QKV projection and
// the output projection), with GEMMs for QKᵀ and PV.
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

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace loom::core::cpu {

//   qkv:   f32[s, b, heads * 3 * d]
//   out:   f32[s, b, heads * d], written
//   probs: f32[b, heads, s, s], written: the softmax probabilities, zero above
//          the diagonal; keep for the backward
absl::Status AttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs);

//   dout:  f32[s, b, heads * d]
//   qkv:   f32[s, b, heads * 3 * d] (the forward input)
//   probs: f32[b, heads, s, s] from the forward
//   dqkv:  f32[s, b, heads * 3 * d], written
absl::Status AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                               int64_t heads, Tensor* dqkv);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_ATTENTION_H_
