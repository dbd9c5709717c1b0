#include "core/ops/contracts/qkv_split_checks.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::core::ops {

absl::StatusOr<QkvSplitDims> CheckQkvSplitArgs(const char* op, const char* proj_name,
                                               const Tensor& proj, const char* qkv_name,
                                               const Tensor& qkv, const QkvSplitOptions& o) {
  const int64_t groups = o.groups == 0 ? o.heads : o.groups;
  if (o.heads <= 0 || groups <= 0 || o.heads % groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": QkvSplitOptions heads ", o.heads, ", groups ", o.groups,
                     ": expected heads > 0 and a multiple of groups (0: one per head)"));
  }
  const int64_t n = o.heads / groups, slots = groups * (n + 2);
  if (proj.rank() != 3 || proj.dim(2) == 0 || proj.dim(2) % slots != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", proj_name, " is ", proj.DebugString(), ", expected [S, B, ", slots,
        " * d] (", groups, " groups of ", n, " query heads, k and v) with d > 0"));
  }
  const int64_t d = proj.dim(2) / slots;
  const Shape want{proj.dim(0), proj.dim(1), o.heads * 3 * d};
  if (qkv.shape() != want) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", qkv_name, " is ", qkv.DebugString(),
                                                   ", expected ", want.ToString(), " for ",
                                                   proj_name, " ", proj.DebugString()));
  }
  int64_t r = 0;
  if (o.rope) {
    const RopeOptions& ro = o.rope_options;
    if (!(ro.base > 0.0f) || !std::isfinite(ro.base)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": RopeOptions.base is ", ro.base, ", expected a finite value > 0"));
    }
    r = ro.rotary_dim == 0 ? d : ro.rotary_dim;
    if (r <= 0 || r > d || r % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": RopeOptions.rotary_dim is ", ro.rotary_dim, " for head dim ", d,
          ": expected an even value in (0, ", d, "], or 0 for the whole head",
          ro.rotary_dim == 0 ? " (which needs an even head dim)" : ""));
    }
    if (ro.position_offset < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": RopeOptions.position_offset is ",
                                                     ro.position_offset, ", expected >= 0"));
    }
  }
  return QkvSplitDims{proj.dim(0), proj.dim(1), o.heads, groups, n, d, r};
}

}  // namespace loom::core::ops
