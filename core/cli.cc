#include "core/cli.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <type_traits>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace loom::core {
namespace {

// [start, end) of the name in "--name[=value]" / "-name[=value]"; false for
// anything else.
bool NameSpan(const std::string& a, size_t* start, size_t* end) {
  if (a.size() <= 2 || a[0] != '-' || a == "--") return false;
  *start = a[1] == '-' ? 2 : 1;
  *end = a.find('=');
  if (*end == std::string::npos) *end = a.size();
  return *end > *start;
}

// Abseil's usage flags: its parser knows them by name, unregistered.
bool IsUsageFlag(absl::string_view name) {
  for (const char* n : {"help", "helpfull", "helpshort", "helppackage", "version",
                        "only_check_args", "helpon", "helpmatch"}) {
    if (name == n) return true;
  }
  return false;
}

// --flagfile, --fromenv, --tryfromenv, --undefok: Abseil's parser acts on them.
bool IsAbseilFlag(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/flags/");
}

// Edits (insert, delete, substitute, swap two neighbours) from a to b.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The shortest linked flag whose name has every word of `name`
// ("tensor_parallel_size" -> "--tensor-model-parallel-size"); "" if none.
std::string FlagWithWords(absl::string_view name) {
  const std::vector<absl::string_view> words = absl::StrSplit(name, '_', absl::SkipEmpty());
  std::string best;
  for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired() || IsAbseilFlag(*flag)) continue;
    const std::vector<absl::string_view> has = absl::StrSplit(flag_name, '_');
    bool all = !words.empty();
    for (absl::string_view w : words) {
      all = all && std::find(has.begin(), has.end(), w) != has.end();
    }
    const std::string shown = DashedFlag(flag_name);
    if (all && (best.empty() || shown.size() < best.size() ||
                (shown.size() == best.size() && shown < best))) {
      best = shown;
    }
  }
  return best;
}

// The linked flag an unknown name was most likely meant to be, as typed
// ("--num-layers", "--no-swiglu"); "" when none is close. A typo or two
// (three in long names), else a flag with all its words.
std::string Suggestion(absl::string_view name) {
  std::string best;
  size_t best_distance = name.size() >= 12 ? 3 : 2;
  auto consider = [&](const std::string& shown, absl::string_view candidate,
                      absl::string_view typed) {
    const size_t d = EditDistance(typed, candidate);
    if (d < best_distance || (d == best_distance && (best.empty() || shown < best))) {
      best = shown;
      best_distance = d;
    }
  };
  absl::string_view negated = name;
  const bool maybe_negated = absl::ConsumePrefix(&negated, "no");
  for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired() || IsAbseilFlag(*flag)) continue;
    consider(DashedFlag(flag_name), flag_name, name);
    if (maybe_negated && flag->IsOfType<bool>()) {
      consider("--no-" + DashedFlag(flag_name).substr(2), flag_name, negated);
    }
  }
  return best.empty() ? FlagWithWords(name) : best;
}

template <typename T>
std::string ExpectedInteger(absl::string_view value) {
  int64_t i;
  uint64_t u;
  if (absl::SimpleAtoi(value, &i) || absl::SimpleAtoi(value, &u)) {  // an integer, out of range
    return absl::StrCat("expected an integer from ", std::numeric_limits<T>::min(), " to ",
                        std::numeric_limits<T>::max());
  }
  return "expected an integer";
}

// What a T flag (or a std::optional<T> one) takes; nullopt for other flags.
template <typename T>
std::optional<std::string> ExpectedFor(const absl::CommandLineFlag& flag, absl::string_view value) {
  const bool optional = flag.IsOfType<std::optional<T>>();
  if (!flag.IsOfType<T>() && !optional) return std::nullopt;
  std::string expected;
  if constexpr (std::is_same_v<T, bool>) {
    expected = "expected true or false";
  } else if constexpr (std::is_integral_v<T>) {
    expected = ExpectedInteger<T>(value);
  } else {
    expected = "expected a number";
  }
  return optional ? expected + " (or nothing: unset)" : expected;
}

// Why `value` is not one of `flag`'s values, in words; for types without
// words here, Abseil's own detail (after its "Illegal value ... specified for
// flag ...", which names the flag with underscores).
std::string Expected(const absl::CommandLineFlag& flag, absl::string_view value,
                     absl::string_view abseil_error) {
  std::optional<std::string> expected;
  auto try_type = [&](auto type_tag) {
    using T = decltype(type_tag);
    if (!expected) expected = ExpectedFor<T>(flag, value);
  };
  try_type(bool{});
  try_type(int16_t{});
  try_type(uint16_t{});
  try_type(int32_t{});
  try_type(uint32_t{});
  try_type(int64_t{});
  try_type(uint64_t{});
  try_type(static_cast<long long>(0));
  try_type(static_cast<unsigned long long>(0));
  try_type(float{});
  try_type(double{});
  if (expected) return *expected;
  const size_t detail = abseil_error.find("; ");
  return detail == absl::string_view::npos ? "" : std::string(abseil_error.substr(detail + 2));
}

// --undefok's names: unknown flags Abseil lets through.
std::set<std::string> UndefOk(const std::vector<std::string>& args) {
  std::set<std::string> names;
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (FlagName(args[i]) != "undefok") continue;
    const size_t eq = args[i].find('=');
    const std::string list =
        eq != std::string::npos ? args[i].substr(eq + 1) : (i + 1 < args.size() ? args[i + 1] : "");
    for (absl::string_view n : absl::StrSplit(list, ',', absl::SkipEmpty())) names.emplace(n);
  }
  return names;
}

// --help, --helpshort or -h before any "--".
bool WantsHelp(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-help" || a == "--helpshort" || a == "-helpshort" || a == "-h") {
      return true;
    }
  }
  return false;
}

std::string ProgramName(const char* argv0) {
  absl::string_view p = argv0 != nullptr ? argv0 : "";
  const size_t slash = p.rfind('/');
  return std::string(slash == absl::string_view::npos ? p : p.substr(slash + 1));
}

}  // namespace

std::string NormalizeFlagName(const std::string& arg) {
  std::string a = arg;
  size_t start, end;
  if (!NameSpan(a, &start, &end)) return a;
  for (size_t k = start; k < end; ++k) {
    if (a[k] == '-') a[k] = '_';
  }
  // Megatron's "--no-x" is Abseil's "--nox" for a boolean x.
  const std::string name = a.substr(start, end - start);
  if (absl::StartsWith(name, "no_") && absl::FindCommandLineFlag(name) == nullptr) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name.substr(3));
    if (flag != nullptr && flag->IsOfType<bool>()) a.erase(start + 2, 1);
  }
  return a;
}

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out;
  bool done = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && !done) {
      if (a == "--") {
        done = true;
      } else {
        a = NormalizeFlagName(a);
      }
    }
    out.push_back(a);
  }
  return out;
}

std::string FlagName(const std::string& arg) {
  const std::string a = NormalizeFlagName(arg);
  size_t start, end;
  if (!NameSpan(a, &start, &end)) return "";
  return a.substr(start, end - start);
}

std::vector<std::string> FlagNamesIn(const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    std::string name = FlagName(args[i]);
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

std::string DashedFlag(absl::string_view name) {
  return absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}));
}

absl::Status CheckFlagArgs(const std::vector<std::string>& args) {
  const std::set<std::string> undefok = UndefOk(args);
  std::vector<std::string> problems;
  for (size_t i = 1; i < args.size(); ++i) {
    // Abseil's reading: "-" and non-dashed words are positional, "--" ends
    // the flags, "-name" is "--name".
    absl::string_view arg = args[i];
    if (!absl::ConsumePrefix(&arg, "-") || arg.empty()) continue;
    absl::ConsumePrefix(&arg, "-");
    if (arg.empty()) break;
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    const bool has_value = eq != absl::string_view::npos;
    std::string value = has_value ? std::string(arg.substr(eq + 1)) : "";
    if (IsUsageFlag(name)) continue;

    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr;
    }
    const std::string shown =
        negated ? "--no-" + DashedFlag(name.substr(2)).substr(2) : DashedFlag(name);
    const std::string typed = has_value ? absl::StrCat(shown, "=", value) : shown;
    if (flag == nullptr) {
      if (undefok.count(name) || (absl::StartsWith(name, "no") && undefok.count(name.substr(2)))) {
        continue;
      }
      const std::string suggestion = Suggestion(name);
      problems.push_back(absl::StrCat(
          typed, ": unknown flag",
          suggestion.empty() ? "" : absl::StrCat(" (did you mean ", suggestion, "?)")));
      continue;
    }
    if (flag->IsOfType<bool>()) {
      if (negated && has_value) {
        problems.push_back(absl::StrCat(typed, ": --no-X takes no value (",
                                        DashedFlag(flag->Name()), "=", value, " does)"));
        continue;
      }
      if (!has_value) continue;  // --x, --nox
    } else if (negated) {
      problems.push_back(absl::StrCat(typed, ": ", DashedFlag(flag->Name()),
                                      " is not a boolean flag: it has no --no- form"));
      continue;
    } else if (!has_value) {  // "--x value"
      if (i + 1 == args.size()) {
        problems.push_back(absl::StrCat(shown, ": missing its value (", shown, "=VALUE)"));
        continue;
      }
      value = args[++i];
    }
    if (flag->IsRetired() || IsAbseilFlag(*flag)) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      const std::string expected = Expected(*flag, value, error);
      problems.push_back(absl::StrCat(shown, "=", value, ": Illegal value '", value, "'",
                                      expected.empty() ? "" : ": ", expected));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

std::vector<char*> ParseCommandLine(int argc, char** argv, const HelpText& help) {
  const std::vector<std::string> normalized = NormalizeFlagNames(argc, argv);
  for (int i = 1; i < argc; ++i) {
    // In place, for the launcher's re-execution: a rewritten argument is never
    // longer than the original ("--no-x" -> "--nox" is shorter).
    if (normalized[i] != argv[i]) {
      std::memcpy(argv[i], normalized[i].c_str(), normalized[i].size() + 1);
    }
  }
  if (help && WantsHelp(normalized)) {
    const std::string text = help();
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    std::exit(0);
  }
  const absl::Status checked = CheckFlagArgs(normalized);
  if (!checked.ok()) {
    const std::string program = ProgramName(argc > 0 ? argv[0] : nullptr);
    for (absl::string_view line : absl::StrSplit(checked.message(), '\n')) {
      std::fprintf(stderr, "%s: %s\n", program.c_str(), std::string(line).c_str());
    }
    std::exit(2);
  }
  return absl::ParseCommandLine(argc, argv);
}

std::string ResolveUserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr || *cwd == '\0') return path;
  return std::string(cwd) + "/" + path;
}

NormalizedArgv::NormalizedArgv(int argc, char** argv) : args_(NormalizeFlagNames(argc, argv)) {
  for (std::string& a : args_) ptrs_.push_back(a.data());
  ptrs_.push_back(nullptr);
}

}  // namespace loom::core
