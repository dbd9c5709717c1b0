#ifndef LOOM_TRAIN_HELP_H_
#define LOOM_TRAIN_HELP_H_

// //train:gpt's --help: its flags as users type them (--num-layers=4), in
// Megatron's groups (flag_groups.h), each with the default the job runs with.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace loom::train {

struct HelpFlag {
  std::string name;           // underscores, as registered
  std::string default_value;  // as the flag parses it
  std::string help;
};

struct HelpSection {
  std::string title;
  std::vector<HelpFlag> flags;
};

// `usage`, then each section: its title, then "  --name=<default>  help" per
// flag with dashed names, the help wrapped to `width` columns in a column of
// its own (starting on the next line when the name is too long for it).
std::string FormatHelp(absl::string_view usage, const std::vector<HelpSection>& sections,
                       int width);

struct GptHelpText {
  std::string text;      // for stdout
  std::string problems;  // FlagGroupProblems::ToString(): "" when the table has every flag
};

// The linked flags whose file `is_help_file` accepts, in GptFlagGroups()'s
// groups (flags in none come last, under "Other"), each with its registered
// default unless `defaults` (underscore name -> value) holds the one the
// binary runs with instead. Wrapped to the terminal's width (100 when stdout
// is no terminal).
GptHelpText GptHelp(absl::string_view usage,
                    const std::function<bool(absl::string_view)>& is_help_file,
                    const std::map<std::string, std::string>& defaults);

}  // namespace loom::train

#endif  // LOOM_TRAIN_HELP_H_
