#ifndef LOOM_LAYERS_WEIGHT_GRAD_STORE_H_
#define LOOM_LAYERS_WEIGHT_GRAD_STORE_H_

// The split backward of the zero-bubble pipeline schedules (#39, Qi et al.
// 2024): BackwardInput computes the input gradient now and defers the
// weight-gradient GEMMs (dW += dYᵀ·X) to BackwardWeight. A backward run
// inside a DeferWeightGrads scope hands each such GEMM, with the operands it
// reads, to the store instead of running it; the store runs them later in
// the order they were deferred, so every gradient accumulates the same
// products in the same order as the fused backward: bit-identical.
//
// The scope is per thread (like Megatron's WeightGradStore, a global queue),
// so the layers between the model and its linears (attention, MLP, MoE) need
// no new parameter; work that runs on helper threads (MoE's experts side by
// side) defers on the calling thread.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"

namespace loom::layers {

class WeightGradStore {
 public:
  using Work = std::function<absl::Status()>;

  // The store this thread's backward defers into, or null (compute now).
  static WeightGradStore* Active();
  // `work` now without an active store, else deferred into it; `bytes`: what
  // the deferred work keeps alive that the backward would have freed (the
  // output gradient, a gathered input), for memory accounting.
  static absl::Status RunOrDefer(Work work, int64_t bytes);

  // Closes the work deferred since the last EndUnit as parameter unit
  // `unit`'s (StageModel units, in backward order).
  void EndUnit(int64_t unit);
  // Runs every closed unit's work in order and then `after_unit(unit)`; the
  // store is empty afterwards (the operands go with the work). The first
  // error stops it.
  absl::Status Run(const std::function<absl::Status(int64_t)>& after_unit);
  bool empty() const { return units_.empty() && open_.empty(); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Unit {
    int64_t id = 0;
    std::vector<Work> work;
  };
  std::vector<Unit> units_;
  std::vector<Work> open_;
  int64_t bytes_ = 0;
};

// Makes `store` the active store of this thread until it goes (then the one
// before it is again). Null: compute now inside the scope.
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradStore* store);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  WeightGradStore* previous_;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_WEIGHT_GRAD_STORE_H_
