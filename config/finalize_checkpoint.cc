#include "absl/strings/str_cat.h"
#include "config/fault_spec.h"
#include "config/finalize.h"

namespace loom::train::finalize {

absl::Status Checkpoint(const TrainConfig& c) {
  if (c.save_interval > 0 && c.save.empty()) {
    return absl::InvalidArgumentError("--save-interval needs --save=<directory>");
  }
  if (c.checkpoint.finetune && c.load.empty()) {
    return absl::InvalidArgumentError("--finetune needs --load=<checkpoint directory>");
  }
  return absl::OkStatus();
}

absl::Status EarlyExit(const TrainConfig& c) {
  if (c.exit_signal_handler && c.save.empty()) {
    return absl::InvalidArgumentError(
        "--exit-signal-handler needs --save=<directory>: on SIGTERM the run saves a checkpoint "
        "there, then exits 0");
  }
  if (c.exit_interval.has_value() && *c.exit_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exit-interval (", *c.exit_interval,
        ") must be >= 1: the run saves and exits when the iteration is a multiple of it "
        "(leave the flag out to run all --train-iters)"));
  }
  if (c.exit_duration_in_mins.has_value() && !(*c.exit_duration_in_mins > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exit-duration-in-mins (", *c.exit_duration_in_mins,
        ") must be > 0: the run saves and exits once it has taken that many minutes "
        "(leave the flag out for no limit)"));
  }
  return absl::OkStatus();
}

absl::Status Faults(const TrainConfig& c, int world_size) {
  return ValidateFaults(c.fault_injection, world_size, c.train_iters);
}

}  // namespace loom::train::finalize
