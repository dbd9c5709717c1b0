#ifndef LOOM_TRAIN_FLAG_GROUPS_H_
#define LOOM_TRAIN_FLAG_GROUPS_H_

// //train:gpt's --help groups its flags as Megatron's arguments.py does. This
// table is the one place a flag gets its group: a flag missing from it (or a
// name in it that is no flag) makes `gpt --help` say so on stderr and
// //train:gpt_help_test fail, so a new flag cannot be forgotten.

#include <set>
#include <string>
#include <vector>

namespace loom::train {

struct FlagGroup {
  const char* title;               // the heading
  std::vector<const char*> flags;  // underscore names, in the order --help lists them
};

// The groups, in --help's order: model, parallelism, data, training,
// checkpointing, logging, launch.
const std::vector<FlagGroup>& GptFlagGroups();

// How `groups` disagree with `flags` (a binary's flag names): flags in no
// group, names that are no flag, names in two places. Empty: they agree.
struct FlagGroupProblems {
  std::vector<std::string> ungrouped;
  std::vector<std::string> not_flags;
  std::vector<std::string> repeated;
  bool empty() const { return ungrouped.empty() && not_flags.empty() && repeated.empty(); }
  // One line per kind, dashed names, saying which file to fix.
  std::string ToString() const;
};
FlagGroupProblems CheckFlagGroups(const std::vector<FlagGroup>& groups,
                                  const std::set<std::string>& flags);

}  // namespace loom::train

#endif  // LOOM_TRAIN_FLAG_GROUPS_H_
