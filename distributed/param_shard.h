#ifndef LOOM_DISTRIBUTED_PARAM_SHARD_H_
#define LOOM_DISTRIBUTED_PARAM_SHARD_H_

// ParamShard: a rank's parameter storage under ZeRO-3
// (--data-parallel-sharding-strategy=optim_grads_params): the f32 values of
// the flat ranges this rank owns, back to back in their order (the
// optimizer's moment layout, as GradientShard's gradients), filled from the
// model's initial values without a full-size buffer ever existing. The
// whole values of a bucket exist only while GradientSync holds its gather
// (see gradient_sync.h); this class holds the owned values (tagged as
// parameters in the ledger) and maps flat ranges to them.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/params.h"

namespace loom::distributed {

class ParamShard {
 public:
  // `owned`: sorted, disjoint flat ranges of `params` (built without value
  // buffers), initialised to ParamBuffer::InitialValues.
  static absl::StatusOr<ParamShard> Create(const std::vector<std::pair<int64_t, int64_t>>& owned,
                                           const layers::ParamBuffer& params);

  const core::Tensor& shard() const { return shard_; }
  core::Tensor& mutable_shard() { return shard_; }
  // The part of shard() holding flat range [from, to), which must lie in one
  // owned range.
  absl::StatusOr<core::Tensor> Slice(int64_t from, int64_t to) const;

 private:
  std::vector<std::pair<int64_t, int64_t>> owned_;
  std::vector<int64_t> owned_at_;  // where each owned range starts in shard_
  core::Tensor shard_;
};

}  // namespace loom::distributed

#endif  // LOOM_DISTRIBUTED_PARAM_SHARD_H_
