#include "absl/strings/str_cat.h"
#include "config/finalize.h"

namespace loom::train::finalize {

absl::Status Logging(const TrainConfig& c) {
  if (c.log_interval < 1 || c.eval_interval < 0 || c.eval_iters < 0 || c.save_interval < 0) {
    return absl::InvalidArgumentError(
        "--log-interval must be >= 1; --eval-interval, --eval-iters, --save-interval >= 0");
  }
  if (c.tensorboard_log_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tensorboard-log-interval (",
                                                   c.tensorboard_log_interval, ") must be >= 1"));
  }
  if (c.tensorboard_dir.empty() &&
      (c.log_memory_to_tensorboard || c.log_validation_ppl_to_tensorboard)) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.log_memory_to_tensorboard ? "--log-memory-to-tensorboard"
                                     : "--log-validation-ppl-to-tensorboard",
        " needs --tensorboard-dir=<directory>"));
  }
  if (c.timing_log_level < 0 || c.timing_log_level > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timing-log-level=", c.timing_log_level,
        ": expected 0 (save-checkpoint), 1 (+ forward-backward, optimizer, gradient "
        "reduction, params-all-gather) or 2 (+ per micro-batch compute, p2p, batch-generator)"));
  }
  if (c.log_timers_to_tensorboard && c.tensorboard_dir.empty()) {
    return absl::InvalidArgumentError(
        "--log-timers-to-tensorboard needs --tensorboard-dir=<directory>");
  }
  return absl::OkStatus();
}

absl::Status Profile(const TrainConfig& c) {
  if (!c.profile) return absl::OkStatus();
  if (c.profile_dir.empty()) {
    return absl::InvalidArgumentError(
        "--profile needs --profile-dir=<directory>: each rank writes rank-R.json there and "
        "rank 0 the merged trace.json");
  }
  if (c.profile_step_start < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile-step-start=", c.profile_step_start,
        ": must be >= 0 (iterations completed when profiling starts)"));
  }
  if (c.profile_step_end <= c.profile_step_start) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile-step-end (", c.profile_step_end, ") must be > --profile-step-start (",
        c.profile_step_start, "): the steps profiled are [start, end)"));
  }
  if (c.profile_step_start >= c.train_iters) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile-step-start (", c.profile_step_start, ") must be < --train-iters (",
        c.train_iters, "): the window would never open"));
  }
  return absl::OkStatus();
}

absl::Status Straggler(const TrainConfig& c) {
  if (c.straggler_minmax_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler-minmax-count (", c.straggler_minmax_count,
        ") must be >= 1: how many of the slowest and of the fastest ranks --log-straggler names"));
  }
  if (c.straggler_minmax_count != 1 && !c.log_straggler) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--straggler-minmax-count (", c.straggler_minmax_count,
        ") needs --log-straggler: it sets how many ranks the straggler report names"));
  }
  if (c.straggler_ctrlr_port.has_value() || c.disable_straggler_on_startup) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.straggler_ctrlr_port.has_value() ? "--straggler-ctrlr-port"
                                            : "--disable-straggler-on-startup",
        " belongs to Megatron's run-time straggler controller (a port that switches the detector "
        "on and off), which Loom does not have: --log-straggler reports with every "
        "--log-interval from the start; leave the flag out"));
  }
  return absl::OkStatus();
}

absl::Status Evaluation(const TrainConfig& c) {
  if (c.skip_train && c.eval_iters < 1) {
    return absl::InvalidArgumentError(
        "--skip-train evaluates only: it needs --eval-iters >= 1 (validation batches)");
  }
  return absl::OkStatus();
}

}  // namespace loom::train::finalize
