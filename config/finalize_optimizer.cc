#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "config/finalize.h"

namespace loom::train::finalize {

absl::Status Optimizer(TrainConfig* c) {
  // --skip-train takes no step: --train-iters=0 is then what it says (Megatron's spelling).
  if (c->train_iters < (c->skip_train ? 0 : 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--train-iters (", c->train_iters, ") must be >= 1",
                     c->skip_train ? "" : " (0 only with --skip-train)"));
  }
  if (c->lr.decay_iters == 0) c->lr.decay_iters = c->train_iters;
  if (c->lr.warmup_iters < 0) c->lr.warmup_iters = std::min<int64_t>(20, c->train_iters / 10);
  absl::Status lr = c->lr.Validate();
  if (!lr.ok()) return lr;
  if (c->hidden_dropout < 0 || c->hidden_dropout >= 1 || c->attention_dropout < 0 ||
      c->attention_dropout >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("--hidden-dropout (", c->hidden_dropout,
                                                   ") and --attention-dropout (",
                                                   c->attention_dropout, ") must lie in [0, 1)"));
  }
  if (c->optimizer.clip_grad < 0 || c->optimizer.weight_decay < 0 || c->optimizer.eps <= 0 ||
      c->optimizer.beta1 < 0 || c->optimizer.beta1 >= 1 || c->optimizer.beta2 < 0 ||
      c->optimizer.beta2 >= 1) {
    return absl::InvalidArgumentError(
        "--clip-grad and --weight-decay must be >= 0, --adam-eps > 0, --adam-beta1/2 in [0, 1)");
  }
  return absl::OkStatus();
}

absl::Status GradientReduction(const TrainConfig& c) {
  if (c.optimizer.bucket_bytes < 4) {
    return absl::InvalidArgumentError(absl::StrCat("--ddp-bucket-size (", c.optimizer.bucket_bytes / 4,
                                                   ") must be >= 1 parameter"));
  }
  if (c.overlap_param_gather && !c.optimizer.distributed) {
    return absl::InvalidArgumentError(
        "--overlap-param-gather needs --use-distributed-optimizer (without it every rank updates "
        "all parameters and nothing is gathered)");
  }
  return absl::OkStatus();
}

}  // namespace loom::train::finalize
