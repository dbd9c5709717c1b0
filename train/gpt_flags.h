#ifndef LOOM_TRAIN_GPT_FLAGS_H_
#define LOOM_TRAIN_GPT_FLAGS_H_

// //train:gpt's flags (Megatron's names; dashes or underscores): the one
// place they are read. Every flag's default is TrainConfig{}'s (config.h).

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "comm/launch/flags.h"
#include "config/config.h"

namespace loom::train {

// The complete TrainConfig the command line gives, the distributed backend
// (--distributed-backend, else --backend) and timeout
// (--distributed-timeout-minutes, else --comm-timeout-s) included, and the
// test-only LOOM_FAULT (config/fault_spec.h) as fault_injection. Relative
// paths are taken from where `bazel run` was started (core::ResolveUserPath).
// Not yet Finalize()d: that needs the world size (comm::launch::PlanLaunch's).
TrainConfig ConfigFromFlags();

// The launcher's flags (comm/launch/flags.h) with the config's backend
// (BackendOf) and timeout in place of --backend and --comm-timeout-s.
comm::launch::CommFlags CommFlagsFor(const TrainConfig& config);

// Megatron's --use-checkpoint-args, the default with --load: every model-
// architecture flag not in `typed` (the flag names given on the command
// line, underscores, see core::FlagNamesIn; "noX" counts as X) takes the
// value in the manifest of the checkpoint --load (and --load-iteration)
// names; a typed one that differs is an error naming the flag
// (checkpoint::CheckModelConfig). Returns the log line naming the values
// taken ("" when nothing was taken, or when there is no --load or no
// checkpoint there yet: loading reports that).
absl::StatusOr<std::string> ApplyCheckpointModelArgs(TrainConfig* config,
                                                     const std::set<std::string>& typed);

}  // namespace loom::train

#endif  // LOOM_TRAIN_GPT_FLAGS_H_
