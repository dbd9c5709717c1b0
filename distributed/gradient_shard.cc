#include "distributed/gradient_shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/memory_stats.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::distributed {

using core::Tensor;

absl::StatusOr<GradientShard> GradientShard::Create(
    const std::vector<std::pair<int64_t, int64_t>>& owned, int64_t bucket_numel,
    core::Device device) {
  core::MemoryScope tag(core::MemoryCategory::kGradients);
  GradientShard s;
  s.owned_ = owned;
  s.bucket_numel_ = std::max<int64_t>(1, bucket_numel);
  s.device_ = device;
  int64_t n = 0;
  for (const auto& [begin, end] : owned) {
    s.owned_at_.push_back(n);
    n += end - begin;
  }
  LOOM_ASSIGN_OR_RETURN(s.shard_,
                        Tensor::Empty(core::Shape{std::max<int64_t>(n, 1)}, core::DType::kF32, device));
  LOOM_RETURN_IF_ERROR(s.Zero());
  return s;
}

absl::StatusOr<Tensor> GradientShard::Slice(int64_t from, int64_t to) const {
  for (size_t i = 0; i < owned_.size(); ++i) {
    if (owned_[i].first <= from && to <= owned_[i].second) {
      return shard_.Narrow(owned_at_[i] + from - owned_[i].first, to - from);
    }
  }
  return absl::InternalError(
      absl::StrCat("GradientShard: [", from, ", ", to, ") is not inside one owned range"));
}

absl::Status GradientShard::Zero() { return core::ops::Zero(&shard_); }

bool GradientShard::HasFree() const {
  return std::find(free_.begin(), free_.end(), true) != free_.end();
}

int64_t GradientShard::pool_bytes() const {
  int64_t bytes = 0;
  for (const Tensor& b : pool_) bytes += 4 * b.numel();
  return bytes;
}

absl::StatusOr<int> GradientShard::Acquire(int64_t numel, int max_buffers, int preferred) {
  if (numel > bucket_numel_) {
    return absl::InternalError(absl::StrCat("GradientShard: a bucket of ", numel,
                                            " elements; the largest is ", bucket_numel_));
  }
  int fit = -1, smallest_free = -1;
  const bool take_preferred = preferred >= 0 && preferred < pool_size() && free_[preferred] &&
                              pool_[preferred].numel() >= numel;
  if (take_preferred) fit = preferred;
  for (int i = 0; i < pool_size() && !take_preferred; ++i) {
    if (!free_[i]) continue;
    const int64_t n = pool_[i].numel();
    if (n >= numel && (fit < 0 || n < pool_[fit].numel())) fit = i;
    if (smallest_free < 0 || n < pool_[smallest_free].numel()) smallest_free = i;
  }
  if (fit < 0) {
    if (pool_size() < max_buffers) {
      fit = pool_size();
      pool_.emplace_back();
      free_.push_back(true);
    } else if (smallest_free >= 0) {
      fit = smallest_free;
      pool_[fit] = Tensor();  // released before its replacement is allocated
    } else {
      return absl::InternalError("GradientShard: every bucket buffer is in use");
    }
    core::MemoryScope tag(core::MemoryCategory::kGradients);
    LOOM_ASSIGN_OR_RETURN(pool_[fit],
                          Tensor::Empty(core::Shape{numel}, core::DType::kF32, device_));
  }
  free_[fit] = false;
  LOOM_ASSIGN_OR_RETURN(Tensor used, pool_[fit].Narrow(0, numel));
  LOOM_RETURN_IF_ERROR(core::ops::Zero(&used));
  return fit;
}

}  // namespace loom::distributed
