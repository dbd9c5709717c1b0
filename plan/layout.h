#ifndef LOOM_PLAN_LAYOUT_H_
#define LOOM_PLAN_LAYOUT_H_

// Layout enumeration: every (TP, CP, PP, VP, DP, EP, SP, micro-batch,
// recomputation, distributed optimizer) that //train:gpt would accept for a
// model on `gpus` ranks. A layout is a finalized train::TrainConfig: the
// trainer's own Finalize() (config/config.h) decides validity, so the planner
// never lists a layout the trainer refuses, and its error is the reason.

#include <set>
#include <string>
#include <vector>

#include "config/config.h"

namespace loom::plan {

struct SearchOptions {
  int gpus = 1;                // world size
  int devices_per_node = 8;    // TP and CP stay within a node unless max_tp says otherwise
  int max_tp = 0;              // 0: devices_per_node
  int max_cp = 1;              // context parallelism is tried up to this
  int64_t max_micro_batch = 8;  // micro-batch sizes tried: 1, 2, 4, ... up to this
  bool try_recompute = true;   // none, selective, full (uniform 1)
  bool try_distributed_optimizer = true;
  bool try_sequence_parallel = true;
  bool try_interleaving = true;
  // Layout flags the user typed (LayoutFlagNames()): every layout keeps
  // `base`'s value of these, even outside the ranges above.
  std::set<std::string> fixed;
};

// The //train:gpt flags (underscore names) that choose a layout.
const std::vector<std::string>& LayoutFlagNames();
// The layout flags among `typed` (core::FlagNamesIn's names; "noX" counts as X).
std::set<std::string> TypedLayoutFlags(const std::vector<std::string>& typed);
// `fixed` as typed, with `c`'s values ("--tensor-model-parallel-size=2
// --nouse-distributed-optimizer"), in LayoutFlagNames() order.
std::string FixedFlags(const train::TrainConfig& c, const std::set<std::string>& fixed);

// Every valid layout, in a stable order. `base` carries the model, the
// global batch, the overlaps and the device; its parallel fields are
// replaced, except those in options.fixed. `rejected` (optional) counts
// candidates Finalize refused.
std::vector<train::TrainConfig> EnumerateLayouts(const train::TrainConfig& base,
                                                 const SearchOptions& options,
                                                 int* rejected = nullptr,
                                                 std::string* first_error = nullptr);

// "TP 2 PP 2 VP 2 DP 4 SP mbs 1 rc selective dist-opt" (CP/EP only when > 1).
std::string DescribeLayout(const train::TrainConfig& c);
// The //train:gpt flags that select this layout.
std::string LayoutFlags(const train::TrainConfig& c);

}  // namespace loom::plan

#endif  // LOOM_PLAN_LAYOUT_H_
