#include "core/cuda/cudnn/graph_desc.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::core::cuda::cudnn {
namespace {

// [s, b, n, d]-major activations as [b, n, s, d], `width` elements per token
// row of one sequence position and batch entry (n * d, or 3 * n * d).
Strided Activation(const AttentionShape& g, int64_t n, int64_t width, int64_t head_stride) {
  Strided t;
  t.dim = {g.batch, n, g.seq, g.head_dim};
  t.stride = {width, head_stride, g.batch * width, 1};
  return t;
}

Strided Stats(const AttentionShape& g) {
  Strided t;
  t.dim = {g.batch, g.heads, g.seq, 1};
  t.stride = {g.heads * g.seq, g.seq, 1, 1};
  return t;
}

SdpaDesc Common(Direction direction, const AttentionShape& g, DType dtype) {
  SdpaDesc desc;
  desc.direction = direction;
  desc.shape = g;
  desc.dtype = dtype;
  desc.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
  desc.o = Activation(g, g.heads, g.heads * g.head_dim, g.head_dim);
  desc.stats = Stats(g);
  return desc;
}

std::string Str(const Strided& t) {
  return absl::StrCat("[", absl::StrJoin(t.dim, ","), "]/[", absl::StrJoin(t.stride, ","), "]");
}

}  // namespace

absl::Status Supports(const AttentionShape& g, DType dtype, float dropout_p) {
  if (g.batch <= 0 || g.seq <= 0 || g.heads <= 0 || g.groups <= 0 || g.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuDNN attention: sizes must be positive (batch ", g.batch, ", seq ", g.seq, ", heads ",
        g.heads, ", groups ", g.groups, ", head dim ", g.head_dim, ")"));
  }
  if (g.heads % g.groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cuDNN attention: heads ", g.heads,
                                                   " is not a multiple of groups ", g.groups));
  }
  if (dtype != DType::kBF16) {
    return absl::UnimplementedError(absl::StrCat(
        "cuDNN attention: dtype ", DTypeName(dtype),
        " is not supported (cuDNN's SDPA runs bf16 only; f32 has no fused path)"));
  }
  if (dropout_p > 0.0f) {
    return absl::UnimplementedError(absl::StrCat(
        "cuDNN attention: attention dropout p = ", dropout_p,
        " is not supported (cuDNN's dropout cannot draw Loom's global-index Philox mask)"));
  }
  if (g.head_dim % 8 != 0 || g.head_dim > kMaxHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("cuDNN attention: head dim ", g.head_dim,
                     " is not supported (needs a multiple of 8, at most ", kMaxHeadDim, ")"));
  }
  return absl::OkStatus();
}

SdpaDesc InterleavedDesc(Direction direction, const AttentionShape& g, DType dtype) {
  SdpaDesc desc = Common(direction, g, dtype);
  const int64_t width = 3 * g.heads * g.head_dim;
  desc.q = Activation(g, g.heads, width, 3 * g.head_dim);
  desc.k = desc.q;
  desc.v = desc.q;
  if (direction == Direction::kBackward) {
    desc.dq = desc.q;
    desc.dk = desc.k;
    desc.dv = desc.v;
  }
  return desc;
}

SdpaDesc SeparateDesc(Direction direction, const AttentionShape& g, DType dtype) {
  SdpaDesc desc = Common(direction, g, dtype);
  desc.q = Activation(g, g.heads, g.heads * g.head_dim, g.head_dim);
  desc.k = Activation(g, g.groups, g.groups * g.head_dim, g.head_dim);
  desc.v = desc.k;
  if (direction == Direction::kBackward) {
    desc.dq = desc.q;
    desc.dk = desc.k;
    desc.dv = desc.v;
  }
  return desc;
}

std::string SdpaDesc::Key() const {
  std::string key = absl::StrCat(
      direction == Direction::kForward ? "fwd" : "bwd", " ", DTypeName(dtype), " b",
      shape.batch, " s", shape.seq, " h", shape.heads, " g", shape.groups, " d", shape.head_dim,
      " scale", scale, causal ? " causal" : "", deterministic ? " det" : "", " q", Str(q), " k",
      Str(k), " v", Str(v), " o", Str(o), " stats", Str(stats));
  if (direction == Direction::kBackward) {
    absl::StrAppend(&key, " dq", Str(dq), " dk", Str(dk), " dv", Str(dv));
  }
  return key;
}

}  // namespace loom::core::cuda::cudnn
