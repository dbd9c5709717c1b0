#ifndef LOOM_LAYERS_MAPPINGS_H_
#define LOOM_LAYERS_MAPPINGS_H_

// The conjugate communication operators of Megatron's tensor parallelism
// (docs/PARALLELISM.md). Each forward has the backward listed beside it:
//
//   operator                 forward                      backward
//   CopyToTp (f)             identity                     all-reduce
//   ReduceFromTp (g)         all-reduce                   identity
//   GatherSequence           all-gather along dim 0       reduce-scatter along dim 0
//   ReduceScatterSequence    reduce-scatter along dim 0   all-gather along dim 0
//   SplitLastDim             keep own slice               all-gather last dim
//   GatherLastDim            all-gather last dim          keep own slice
//
// Activations are [s, b, h] (sequence first), so dim-0 collectives move
// contiguous blocks. The "...Async" forms return the Work handle so callers
// can overlap the communication with a GEMM.

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/tensor.h"
#include "layers/tp_group.h"

namespace loom::layers {

// Work->WaitOnStream(), adding the host time blocked to tp.stats when set
// (a null work: nothing to wait for).
absl::Status WaitTp(const TpGroup& tp, const comm::WorkPtr& work);

// In-place all-reduce (sum) over TP; no-op for TP = 1.
absl::Status AllReduceTp(const TpGroup& tp, const core::Tensor& x);
comm::WorkPtr AllReduceTpAsync(const TpGroup& tp, const core::Tensor& x);

// [s/p, b, h] -> [s, b, h]: rank r's block becomes rows [r·s/p, (r+1)·s/p).
absl::StatusOr<core::Tensor> AllGatherSeq(const TpGroup& tp, const core::Tensor& x);
// Starts the gather into a new tensor *out; returns the handle.
comm::WorkPtr AllGatherSeqAsync(const TpGroup& tp, const core::Tensor& x, core::Tensor* out);
// [s, b, h] -> [s/p, b, h]: sums over ranks and keeps this rank's block.
absl::StatusOr<core::Tensor> ReduceScatterSeq(const TpGroup& tp, const core::Tensor& x);
comm::WorkPtr ReduceScatterSeqAsync(const TpGroup& tp, const core::Tensor& x, core::Tensor* out);

// Last-dimension split/gather: [..., n] <-> [..., n/p].
absl::StatusOr<core::Tensor> SplitLastDim(const TpGroup& tp, const core::Tensor& x);
absl::StatusOr<core::Tensor> GatherLastDim(const TpGroup& tp, const core::Tensor& x);

// The six operators as forward/backward pairs (names as in the spec).
struct CopyToTp {
  static absl::StatusOr<core::Tensor> Forward(const TpGroup&, const core::Tensor& x) { return x; }
  static absl::StatusOr<core::Tensor> Backward(const TpGroup& tp, const core::Tensor& dy);
};
struct ReduceFromTp {
  static absl::StatusOr<core::Tensor> Forward(const TpGroup& tp, const core::Tensor& x);
  static absl::StatusOr<core::Tensor> Backward(const TpGroup&, const core::Tensor& dy) {
    return dy;
  }
};
struct GatherSequence {
  static absl::StatusOr<core::Tensor> Forward(const TpGroup& tp, const core::Tensor& x) {
    return AllGatherSeq(tp, x);
  }
  static absl::StatusOr<core::Tensor> Backward(const TpGroup& tp, const core::Tensor& dy) {
    return ReduceScatterSeq(tp, dy);
  }
};
struct ReduceScatterSequence {
  static absl::StatusOr<core::Tensor> Forward(const TpGroup& tp, const core::Tensor& x) {
    return ReduceScatterSeq(tp, x);
  }
  static absl::StatusOr<core::Tensor> Backward(const TpGroup& tp, const core::Tensor& dy) {
    return AllGatherSeq(tp, dy);
  }
};
struct SplitLast {
  static absl::StatusOr<core::Tensor> Forward(const TpGroup& tp, const core::Tensor& x) {
    return SplitLastDim(tp, x);
  }
  static absl::StatusOr<core::Tensor> Backward(const TpGroup& tp, const core::Tensor& dy) {
    return GatherLastDim(tp, dy);
  }
};
struct GatherLast {
  static absl::StatusOr<core::Tensor> Forward(const TpGroup& tp, const core::Tensor& x) {
    return GatherLastDim(tp, x);
  }
  static absl::StatusOr<core::Tensor> Backward(const TpGroup& tp, const core::Tensor& dy) {
    return SplitLastDim(tp, dy);
  }
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_MAPPINGS_H_
