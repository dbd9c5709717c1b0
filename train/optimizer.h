#ifndef LOOM_TRAIN_OPTIMIZER_H_
#define LOOM_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "config/optimizer_config.h"
#include "core/tensor.h"
#include "layers/params.h"

namespace loom::train {

// The groups the gradient norm is summed over (null = size 1).
struct OptimizerGroups {
  comm::Communicator* tp = nullptr;
  comm::Communicator* pp = nullptr;
  // The group this rank's owned ranges are a shard of (ZeRO-1's DP group);
  // null when every rank of the DP group owns (a replica of) everything.
  comm::Communicator* shards = nullptr;
  // Expert parallelism: the EP group, whose ranks hold different experts
  // (ParamSpec::expert): their squares are summed over it in the norm, unless
  // `shards` is set: ZeRO-1 shards them over the expert-data-parallel ranks
  // (DP / EP x CP), and those and the EP ranks together are the shards group
  // (DP x CP), whose sum then counts each expert element once.
  comm::Communicator* experts = nullptr;
};

// [begin, end) of the flat parameter buffer.
using FlatRange = std::pair<int64_t, int64_t>;

// AdamW over the ranges of a rank's flat parameter buffer it owns: all of it,
// or its ZeRO-1 shard (GradientSync::owned()). It only updates: the
// gradients it reads are final (GradientSync::FinishGradients), and under
// ZeRO-1 the updated values are gathered by GradientSync::StartParamGather.
// Clipping uses the global gradient norm over TP, PP and the shards, each
// parameter counted once (replicated ones on TP rank 0, a tied copy not).
class Optimizer {
 public:
  // `owned`: sorted, disjoint ranges within params->padded_numel() (empty:
  // the whole buffer). `owned_grads`: under ZeRO-2 the owned ranges'
  // gradients back to back (GradientSync::owned_grads()); undefined: they
  // are in params->flat_grads() at their flat offsets. `owned_values`:
  // under ZeRO-3 the owned ranges' f32 values back to back
  // (GradientSync::owned_values()), updated in place (the model holds no
  // values between units, so no compute copy is refreshed: each unit's is
  // converted when it is gathered); undefined: params->flat_values().
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(layers::ParamBuffer* params,
                                                          const OptimizerConfig& config,
                                                          const OptimizerGroups& groups,
                                                          std::vector<FlatRange> owned = {},
                                                          core::Tensor owned_grads = {},
                                                          core::Tensor owned_values = {});

  // One AdamW step at learning rate `lr` over the owned ranges, clipped by
  // the global gradient norm, which it returns (before clipping). Refreshes
  // the bf16 compute copy of what it updated. Collective over the groups.
  absl::StatusOr<double> Step(float lr);
  // The global gradient norm alone (what Step clips by). Collective.
  absl::StatusOr<double> GradNorm() const;

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  // Adam moments of the owned ranges, concatenated in order.
  const core::Tensor& exp_avg() const { return m_; }
  const core::Tensor& exp_avg_sq() const { return v_; }
  core::Tensor& mutable_exp_avg() { return m_; }
  core::Tensor& mutable_exp_avg_sq() { return v_; }
  const std::vector<FlatRange>& owned() const { return owned_; }

 private:
  Optimizer(layers::ParamBuffer* params, OptimizerConfig config, OptimizerGroups groups)
      : params_(params), config_(config), groups_(groups) {}
  bool Counted(const layers::Param& p) const;
  // Expert squares take a sum of their own over EP (see OptimizerGroups::experts).
  bool SumExpertsOverEp() const { return groups_.experts != nullptr && groups_.shards == nullptr; }
  // Adjacent parameters merged into runs of the flat buffer, cut to the owned
  // ranges, so a step is a handful of kernel calls (one per run) instead of
  // one per tensor: on a GPU each call is a launch, and each norm term a host
  // sync.
  struct Run {
    int64_t begin, end;    // element range of the flat buffer
    int64_t moment_begin;  // where `begin` sits in the moments
    bool weight_decay;
  };
  void BuildRuns();
  // Whether update_runs_ cover the owned ranges exactly, so refreshing the
  // compute copy run by run (AdamWStepWithCopy) copies what
  // SyncComputeCopy(owned_) would.
  bool RunsTileOwned() const;
  std::vector<Run> norm_runs_;    // owned parameters counted in the global norm
  std::vector<Run> expert_norm_runs_;  // the expert weights among them (EP)
  std::vector<Run> update_runs_;  // owned parameters, split where weight decay changes

  layers::ParamBuffer* params_;
  OptimizerConfig config_;
  OptimizerGroups groups_;
  std::vector<FlatRange> owned_;
  core::Tensor owned_grads_;  // ZeRO-2; see Create
  core::Tensor owned_values_;  // ZeRO-3; see Create
  // The values of `run`: in owned_values_ at its moment offset, else in the
  // flat buffer at its flat offset.
  absl::StatusOr<core::Tensor> ValueOf(const Run& run) const;
  // The gradients of `run`: in owned_grads_ at its moment offset, else in
  // the flat buffer at its flat offset.
  absl::StatusOr<core::Tensor> GradOf(const Run& run) const;
  core::Tensor m_, v_;  // Adam moments over the owned ranges
  int64_t step_ = 0;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_OPTIMIZER_H_
