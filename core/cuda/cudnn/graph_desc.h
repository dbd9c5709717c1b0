#ifndef LOOM_CORE_CUDA_CUDNN_GRAPH_DESC_H_
#define LOOM_CORE_CUDA_CUDNN_GRAPH_DESC_H_

// The pure description of a cuDNN SDPA graph: every tensor's [b, h, s, d]
// dims and element strides, the dtype and the direction. No CUDA, no cuDNN:
// it is built, compared and tested on any machine, and it is the graph
// cache's key. sdpa_graph.h turns one into a cudnn-frontend graph.
//
// Layouts (all strides in elements, dims in cuDNN's [b, h, s, d] order):
//   interleaved qkv [s, b, heads, {q, k, v}, d] (Loom's fused QKV output):
//     Q, K, V strides [3hd, 3d, 3bhd, 1]; K starts d, V 2d elements after Q
//   separate q [s, b, heads * d], k and v [s, b, groups * d]:
//     Q [hd, d, bhd, 1]; K, V [gd, d, bgd, 1]
//   O, dO [s, b, heads * d]: [hd, d, bhd, 1]
//   stats (Loom's lse) f32 [b, heads, s] as [b, h, s, 1]: [hs, s, 1, 1]
//   dQ, dK, dV: the strides of Q, K, V (dqkv interleaved like qkv).

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace loom::core::cuda::cudnn {

// One attention call's sizes. groups == heads is plain multi-head attention;
// groups < heads (heads % groups == 0) is grouped-query attention, each K/V
// head serving heads / groups query heads.
struct AttentionShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t groups = 0;
  int64_t head_dim = 0;
};

// Hopper's SDPA limits that Loom checks itself (cuDNN's validate() checks the
// rest): head dim a multiple of 8, at most kMaxHeadDim.
inline constexpr int64_t kMaxHeadDim = 128;

// OK when cuDNN's SDPA can run this call; otherwise Unimplemented with the
// reason (the caller falls back to Loom's own flash kernel):
//   dtype other than bf16 (cuDNN's SDPA has no f32 path),
//   dropout_p > 0 (cuDNN's dropout cannot draw Loom's global-index Philox
//     mask, which keeps every tensor-parallel layout bit-identical),
//   head dim not a multiple of 8 or above kMaxHeadDim.
// Malformed sizes (non-positive, heads % groups != 0) are InvalidArgument.
absl::Status Supports(const AttentionShape& shape, DType dtype, float dropout_p);

enum class Direction { kForward, kBackward };

// Dims and element strides of one tensor, [b, h, s, d] order.
struct Strided {
  std::array<int64_t, 4> dim{};
  std::array<int64_t, 4> stride{};
  bool operator==(const Strided& o) const { return dim == o.dim && stride == o.stride; }
};

struct SdpaDesc {
  Direction direction = Direction::kForward;
  AttentionShape shape;
  DType dtype = DType::kBF16;  // Q, K, V, O, dO, dQ, dK, dV; stats are f32
  float scale = 0.0f;          // 1 / sqrt(head_dim)
  bool causal = true;          // top-left aligned: query i sees keys j <= i
  bool deterministic = true;   // backward: cuDNN's deterministic algorithm
  Strided q, k, v, o, stats;   // backward: dO has o's layout
  Strided dq, dk, dv;          // backward only (zeros in a forward)

  // Every field, for the graph cache and logs, e.g.
  // "fwd bf16 b4 s2048 h16 g16 d64 scale0.125 causal det q[...]/[...] ...".
  std::string Key() const;
};

// The interleaved-qkv graph (groups must equal heads).
SdpaDesc InterleavedDesc(Direction direction, const AttentionShape& shape, DType dtype);
// The separate q / k / v graph (any groups dividing heads).
SdpaDesc SeparateDesc(Direction direction, const AttentionShape& shape, DType dtype);

// Element offsets of K and V from Q's first element in the interleaved qkv.
inline int64_t InterleavedKOffset(int64_t head_dim) { return head_dim; }
inline int64_t InterleavedVOffset(int64_t head_dim) { return 2 * head_dim; }

}  // namespace loom::core::cuda::cudnn

#endif  // LOOM_CORE_CUDA_CUDNN_GRAPH_DESC_H_
