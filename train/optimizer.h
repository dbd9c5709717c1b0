#ifndef LOOM_TRAIN_OPTIMIZER_H_
#define LOOM_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/tensor.h"
#include "layers/params.h"

namespace loom::train {

struct OptimizerConfig {
  float beta1 = 0.9f;         // --adam-beta1
  float beta2 = 0.999f;       // --adam-beta2
  float eps = 1e-8f;          // --adam-eps
  float weight_decay = 0.01f; // --weight-decay (not applied to biases and LayerNorm)
  float clip_grad = 1.0f;     // --clip-grad (0: no clipping)
  bool distributed = false;   // --use-distributed-optimizer (ZeRO-1 over DP)
  int64_t bucket_bytes = 4 << 20;  // data-parallel gradient buckets
};

// The groups the optimizer talks to (null = size 1).
struct OptimizerGroups {
  comm::Communicator* tp = nullptr;
  comm::Communicator* pp = nullptr;
  comm::Communicator* dp = nullptr;
  // With PP > 1 the tied token embedding lives on the first and last stage:
  // the norm counts it on the first only.
  bool count_word_embedding = true;
};

// AdamW over a rank's contiguous parameter buffer, with data parallelism:
//  - plain: gradients are averaged over DP in buckets (all started at once,
//    then waited), every DP rank updates the whole buffer;
//  - distributed (ZeRO-1): gradients are reduce-scattered (averaged) so each
//    DP rank owns 1/DP of the buffer's gradients, Adam moments and update;
//    the updated parameters are all-gathered.
// Clipping uses the global gradient norm over TP, PP and DP shards, each
// parameter counted once (replicated ones on TP rank 0 only).
class Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(layers::ParamBuffer* params,
                                                          const OptimizerConfig& config,
                                                          const OptimizerGroups& groups);

  // Reduces the gradients over DP and returns the global gradient norm
  // (before clipping). Call once per step after the backward passes.
  // `already_averaged`: the DP average was done during the backward
  // (--overlap-grad-reduce); only the norm is computed.
  absl::StatusOr<double> ReduceGradients(bool already_averaged = false);
  // One AdamW step at learning rate `lr`, clipping by the norm from
  // ReduceGradients.
  absl::Status Step(float lr);

  int64_t step_count() const { return step_; }
  // This rank's moments: the whole buffer, or its DP shard (distributed).
  const core::Tensor& exp_avg() const { return m_; }
  const core::Tensor& exp_avg_sq() const { return v_; }
  core::Tensor& mutable_exp_avg() { return m_; }
  core::Tensor& mutable_exp_avg_sq() { return v_; }
  void set_step_count(int64_t step) { step_ = step; }
  // [shard_begin, shard_end) of the flat buffer this rank updates.
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }

 private:
  Optimizer(layers::ParamBuffer* params, OptimizerConfig config, OptimizerGroups groups)
      : params_(params), config_(config), groups_(groups) {}
  bool Counted(const layers::Param& p) const;
  // Adjacent parameters merged into runs of the flat buffer, so a step is a
  // handful of kernel calls (one per run) instead of one per tensor: on a
  // GPU each call is a launch, and each norm term a host sync.
  struct Run {
    int64_t begin, end;  // element range of the flat buffer
    bool weight_decay;
  };
  void BuildRuns();
  std::vector<Run> norm_runs_;    // parameters counted in the global norm
  std::vector<Run> update_runs_;  // all parameters, split where weight decay changes

  layers::ParamBuffer* params_;
  OptimizerConfig config_;
  OptimizerGroups groups_;
  int64_t shard_begin_ = 0, shard_end_ = 0;
  core::Tensor m_, v_;          // Adam moments over [shard_begin, shard_end)
  core::Tensor shard_grads_;    // distributed: this rank's averaged gradient shard
  double last_norm_ = 0;
  int64_t step_ = 0;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_OPTIMIZER_H_
