#ifndef LOOM_CHECKPOINT_CONVERT_H_
#define LOOM_CHECKPOINT_CONVERT_H_

#include <string>

#include "absl/status/status.h"

namespace loom::checkpoint {

// Offline resharding: rewrites checkpoint folder `src_iter_dir` (a
// DIR/iter_N) into `dst_dir`/iter_N as if saved by a TP `tp` x PP `pp` (DP 1)
// run: one shard file per target rank, then `latest`. Parameters and (if
// present) Adam moments are carried over exactly. Errors name the flag
// whose value does not fit the model.
absl::Status ConvertCheckpoint(const std::string& src_iter_dir, const std::string& dst_dir,
                               int tp, int pp);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_CONVERT_H_
