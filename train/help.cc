#include "train/help.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/cli.h"
#include "train/flag_groups.h"

namespace loom::train {
namespace {

// Where every flag's help starts: most "--name=<default>" fit before it.
constexpr int kHelpColumn = 38;

// `text` in lines of at most `width` characters (a longer word alone).
std::vector<std::string> Wrap(absl::string_view text, int width) {
  std::vector<std::string> lines;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && static_cast<int>(line.size() + 1 + word.size()) > width) {
      lines.push_back(line);
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

int TerminalWidth() {
  winsize w{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col >= 60) {
    return std::min<int>(w.ws_col, 120);
  }
  return 100;
}

}  // namespace

std::string FormatHelp(absl::string_view usage, const std::vector<HelpSection>& sections,
                       int width) {
  std::string out = absl::StrCat(usage, "\n");
  const std::string indent(kHelpColumn, ' ');
  for (const HelpSection& s : sections) {
    if (s.flags.empty()) continue;
    absl::StrAppend(&out, "\n", s.title, ":\n");
    for (const HelpFlag& f : s.flags) {
      std::string head = absl::StrCat("  ", core::DashedFlag(f.name), "=",
                                      f.default_value.empty() ? "\"\"" : f.default_value);
      const std::vector<std::string> help = Wrap(f.help, std::max(20, width - kHelpColumn));
      if (help.empty()) {
        absl::StrAppend(&out, head, "\n");
        continue;
      }
      if (static_cast<int>(head.size()) + 2 > kHelpColumn) {  // the help starts below
        absl::StrAppend(&out, head, "\n");
        head = indent;
      } else {
        head.resize(kHelpColumn, ' ');
      }
      for (size_t k = 0; k < help.size(); ++k) {
        absl::StrAppend(&out, k == 0 ? head : indent, help[k], "\n");
      }
    }
  }
  return out;
}

GptHelpText GptHelp(absl::string_view usage,
                    const std::function<bool(absl::string_view)>& is_help_file,
                    const std::map<std::string, std::string>& defaults) {
  std::map<std::string, HelpFlag> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired() || !is_help_file(flag->Filename())) continue;
    const auto d = defaults.find(std::string(name));
    flags[std::string(name)] = {std::string(name),
                                d != defaults.end() ? d->second : flag->DefaultValue(),
                                flag->Help()};
  }
  std::set<std::string> names;
  for (const auto& [name, f] : flags) names.insert(name);
  const FlagGroupProblems problems = CheckFlagGroups(GptFlagGroups(), names);

  std::vector<HelpSection> sections;
  for (const FlagGroup& g : GptFlagGroups()) {
    HelpSection& s = sections.emplace_back(HelpSection{g.title, {}});
    for (const char* name : g.flags) {
      auto f = flags.find(name);
      if (f != flags.end()) s.flags.push_back(f->second);
    }
  }
  HelpSection& other =
      sections.emplace_back(HelpSection{"Other (in no group of train/flag_groups.cc)", {}});
  for (const std::string& name : problems.ungrouped) other.flags.push_back(flags[name]);

  const int width = TerminalWidth();
  std::string text = FormatHelp(usage, sections, width);
  text += "\n";
  for (const std::string& line :
       Wrap("Names take dashes or underscores; --no-X sets a boolean X to false. Abseil's own "
            "flags: --helpfull (every linked flag), --flagfile=FILE.",
            width)) {
    absl::StrAppend(&text, line, "\n");
  }
  return {text, problems.ToString()};
}

}  // namespace loom::train
