#ifndef LOOM_CORE_CPU_QKV_SPLIT_H_
#define LOOM_CORE_CPU_QKV_SPLIT_H_

// Attention's QKV rearrangement fused with RoPE (core/ops/contracts/options.h:
// QkvSplitOptions): the projection [S, B, groups * (n + 2) * d], rows
// [group, {q x n, k, v}, d], to the attention kernels' [S, B, heads, 3, d],
// and back. It replaces the layer's row gathers (EmbeddingForward over index
// tables built on the host), RopeForward / RopeBackward and the scatter-adds
// (EmbeddingBackward), with the same float operations in the same order, so
// its results are bit-identical to that composition (qkv_split_test).

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::QkvSplitOptions;  // the contract's options

// For token row t = s * B + b, query head m of group g = m / n (j = m % n):
//   qkv[t, m, 0] = rope(proj[t, g, j])   (q)
//   qkv[t, m, 1] = rope(proj[t, g, n])   (k: the group's, for each of its heads)
//   qkv[t, m, 2] = proj[t, g, n + 1]     (v)
// rope(x) is RopeForward's rotation at position s + rope_options.position_offset,
// the identity without `rope`.
//   proj: f32[S, B, groups * (n + 2) * d]; qkv: f32[S, B, heads * 3 * d]
//   (distinct storage).
absl::Status QkvSplitRopeForward(const Tensor& proj, const QkvSplitOptions& o, Tensor* qkv);

// The gradient: dproj's q row is rope⁻¹(dqkv[t, m, 0]); its k and v rows are
// the sums of dqkv[t, m, 1] (k, then un-rotated) and dqkv[t, m, 2] over the
// group's heads m in increasing order, in f32 (deterministic, no atomics).
//   dqkv: f32[S, B, heads * 3 * d]; dproj: f32[S, B, groups * (n + 2) * d],
//   overwritten (distinct storage).
absl::Status QkvSplitRopeBackward(const Tensor& dqkv, const QkvSplitOptions& o, Tensor* dproj);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_QKV_SPLIT_H_
