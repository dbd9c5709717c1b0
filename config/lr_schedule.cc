#include "config/lr_schedule.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace loom::train {

absl::Status LrSchedule::Validate() const {
  if (lr < 0 || min_lr < 0 || min_lr > lr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr (", lr, ") and --min-lr (", min_lr, ") must satisfy 0 <= min-lr <= lr"));
  }
  if (warmup_iters < 0 || decay_iters < 0) {
    return absl::InvalidArgumentError("--lr-warmup-iters and --lr-decay-iters must be >= 0");
  }
  if (decay_iters > 0 && warmup_iters > decay_iters) {
    return absl::InvalidArgumentError(absl::StrCat("--lr-warmup-iters (", warmup_iters,
                                                   ") exceeds --lr-decay-iters (", decay_iters,
                                                   ")"));
  }
  return absl::OkStatus();
}

float LrSchedule::At(int64_t iter) const {
  const int64_t step = iter + 1;  // the first step already gets a non-zero rate
  if (warmup_iters > 0 && step <= warmup_iters) {
    return lr * static_cast<float>(step) / static_cast<float>(warmup_iters);
  }
  if (style == LrDecayStyle::kConstant) return lr;
  if (step >= decay_iters) return min_lr;
  const double progress =
      static_cast<double>(step - warmup_iters) / static_cast<double>(decay_iters - warmup_iters);
  const double coeff = style == LrDecayStyle::kLinear ? 1.0 - progress
                                                      : 0.5 * (std::cos(M_PI * progress) + 1.0);
  return static_cast<float>(min_lr + coeff * (lr - min_lr));
}

}  // namespace loom::train
