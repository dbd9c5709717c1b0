#ifndef LOOM_CONFIG_LR_SCHEDULE_H_
#define LOOM_CONFIG_LR_SCHEDULE_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/enum_names.h"

namespace loom::train {

// --lr-decay-style.
enum class LrDecayStyle { kConstant, kLinear, kCosine };
LOOM_ENUM_NAMES(LrDecayStyle, {LrDecayStyle::kConstant, "constant"},
                {LrDecayStyle::kLinear, "linear"}, {LrDecayStyle::kCosine, "cosine"})

// Megatron's learning-rate schedule: linear warm-up from 0 to `lr` over
// `warmup_iters`, then decay to `min_lr` by `decay_iters` (constant, linear
// or cosine), then `min_lr`. Pure function of the iteration, so resuming
// from a checkpoint needs only the iteration number.
struct LrSchedule {
  float lr = 3e-4f;           // --lr
  float min_lr = 0.0f;        // --min-lr
  LrDecayStyle style = LrDecayStyle::kCosine;  // --lr-decay-style
  int64_t warmup_iters = 0;   // --lr-warmup-iters
  int64_t decay_iters = 0;    // --lr-decay-iters (0: --train-iters)

  absl::Status Validate() const;
  // The rate for iteration `iter` (0-based: the first step uses At(0)).
  float At(int64_t iter) const;
};

}  // namespace loom::train

#endif  // LOOM_CONFIG_LR_SCHEDULE_H_
