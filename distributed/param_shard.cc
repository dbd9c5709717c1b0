#include "distributed/param_shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/memory_stats.h"
#include "core/status_macros.h"

namespace loom::distributed {

using core::Tensor;

absl::StatusOr<ParamShard> ParamShard::Create(
    const std::vector<std::pair<int64_t, int64_t>>& owned, const layers::ParamBuffer& params) {
  core::MemoryScope tag(core::MemoryCategory::kParameters);
  ParamShard s;
  s.owned_ = owned;
  int64_t n = 0;
  for (const auto& [begin, end] : owned) {
    s.owned_at_.push_back(n);
    n += end - begin;
  }
  // Initialised on the host, range by range, then placed.
  LOOM_ASSIGN_OR_RETURN(Tensor host, Tensor::Zeros(core::Shape{std::max<int64_t>(n, 1)},
                                                   core::DType::kF32));
  for (size_t i = 0; i < owned.size(); ++i) {
    LOOM_RETURN_IF_ERROR(params.InitialValues(owned[i].first, owned[i].second,
                                              host.data<float>() + s.owned_at_[i]));
  }
  if (params.device().is_cpu()) {
    s.shard_ = std::move(host);
  } else {
    LOOM_ASSIGN_OR_RETURN(s.shard_, host.To(params.device()));
  }
  return s;
}

absl::StatusOr<Tensor> ParamShard::Slice(int64_t from, int64_t to) const {
  for (size_t i = 0; i < owned_.size(); ++i) {
    if (owned_[i].first <= from && to <= owned_[i].second) {
      return shard_.Narrow(owned_at_[i] + from - owned_[i].first, to - from);
    }
  }
  return absl::InternalError(
      absl::StrCat("ParamShard: [", from, ", ", to, ") is not inside one owned range"));
}

}  // namespace loom::distributed
