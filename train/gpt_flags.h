#ifndef LOOM_TRAIN_GPT_FLAGS_H_
#define LOOM_TRAIN_GPT_FLAGS_H_

#include "absl/status/statusor.h"
#include "train/config.h"

namespace loom::train {

// The TrainConfig given by //train:gpt's command line (Megatron's flag
// names; dashes or underscores). Not yet Finalize()d: that needs the world size.
TrainConfig ConfigFromFlags();

// --distributed-backend, falling back to --backend.
std::string BackendFromFlags();
// --distributed-timeout-minutes in seconds (0 = use --comm-timeout-s).
double TimeoutSecondsFromFlags();

}  // namespace loom::train

#endif  // LOOM_TRAIN_GPT_FLAGS_H_
