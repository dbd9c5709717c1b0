#ifndef LOOM_DISTRIBUTED_GRADIENT_SHARD_H_
#define LOOM_DISTRIBUTED_GRADIENT_SHARD_H_

// GradientShard: a rank's gradient storage under ZeRO-2
// (--data-parallel-sharding-strategy=optim_grads). Only two things persist:
//   shard()   the f32 gradients of the flat ranges this rank owns, back to
//             back in their order (the optimizer's moment layout), which
//             accumulate every micro-batch's reduce-scattered average;
//   a pool    of f32 bucket buffers: a bucket's full-size gradient exists
//             only in one of them, from the backward that starts the bucket
//             to the end of its reduce-scatter. A bucket takes the smallest
//             free buffer it fits in; the pool's size (in buffers) is
//             GradientSync's choice, and a free buffer too small for the
//             bucket at hand is replaced rather than a new one added.
// GradientSync decides when a buffer is bound and released; this class only
// holds the memory (tagged as gradients in the ledger) and maps flat ranges
// to the shard.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom::distributed {

class GradientShard {
 public:
  // `owned`: sorted, disjoint flat ranges; `bucket_numel`: the largest
  // bucket's elements (no bucket is larger).
  static absl::StatusOr<GradientShard> Create(const std::vector<std::pair<int64_t, int64_t>>& owned,
                                              int64_t bucket_numel, core::Device device);

  const core::Tensor& shard() const { return shard_; }
  // The part of shard() holding flat range [from, to), which must lie in one
  // owned range.
  absl::StatusOr<core::Tensor> Slice(int64_t from, int64_t to) const;
  absl::Status Zero();

  // A pool buffer of at least `numel` elements, its first `numel` zeroed:
  // `preferred` if it is free and fits; else the smallest free one that
  // fits; else a new one while the pool holds fewer than `max_buffers`;
  // else the smallest free one, reallocated. Error when none is free and
  // the pool is full.
  absl::StatusOr<int> Acquire(int64_t numel, int max_buffers, int preferred = -1);
  bool HasFree() const;
  void Release(int buffer) { free_[buffer] = true; }
  const core::Tensor& buffer(int i) const { return pool_[i]; }
  int pool_size() const { return static_cast<int>(pool_.size()); }
  int64_t pool_bytes() const;

 private:
  std::vector<std::pair<int64_t, int64_t>> owned_;
  std::vector<int64_t> owned_at_;  // where each owned range starts in shard_
  core::Tensor shard_;
  int64_t bucket_numel_ = 0;
  core::Device device_;
  std::vector<core::Tensor> pool_;
  std::vector<bool> free_;
};

}  // namespace loom::distributed

#endif  // LOOM_DISTRIBUTED_GRADIENT_SHARD_H_
