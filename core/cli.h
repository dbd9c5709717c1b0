#ifndef LOOM_CORE_CLI_H_
#define LOOM_CORE_CLI_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace loom::core {

// Megatron spells flags with dashes (--tensor-model-parallel-size); Abseil
// flags are identifiers with underscores. Returns argv with the name part of
// every "--flag-name[=value]" rewritten to "--flag_name[=value]" (values are
// untouched; nothing after a bare "--" is changed), so users can type either.
// "--no-x" for a boolean flag x becomes Abseil's "--nox" (unless no_x is a
// flag itself). This is the only flag-name rewriter in the tree: ParseCommandLine
// below, comm/launch's ParseFlags and every binary's main use it.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);
// One argument ("--a-b=c-d" -> "--a_b=c-d"; anything but a flag is returned as is).
std::string NormalizeFlagName(const std::string& arg);

// The name of a flag argument with underscores ("--nproc-per-node=2" and
// "-nproc_per_node" give "nproc_per_node"); "" for a value, a positional
// argument or "--".
std::string FlagName(const std::string& arg);
// The names of the flags in `args` (argv[0] first), up to a bare "--".
std::vector<std::string> FlagNamesIn(const std::vector<std::string>& args);

// A flag name as users type it: "num_layers" -> "--num-layers".
std::string DashedFlag(absl::string_view name);

// Checks the flag arguments of `args` (argv[0] first, names normalized, up to
// a bare "--") against the linked Abseil flags the way absl::ParseCommandLine
// reads them (--name=value, --name value, -name, --bool, --nobool), but names
// every problem the way users type flags, one line each:
//   --num-layers=abc: Illegal value 'abc': expected an integer
//   --num-layyers=2: unknown flag (did you mean --num-layers?)
// Abseil's own flags (--help*, --version, --flagfile, --fromenv, --undefok,
// ...) and the flags inside a --flagfile are left to Abseil. A flag whose
// value parses is set to it (absl::ParseCommandLine sets it again).
absl::Status CheckFlagArgs(const std::vector<std::string>& args);

// What a binary prints for --help, instead of Abseil's list.
using HelpText = std::function<std::string()>;

// Loom's command-line parser: rewrites argv's flag names in place
// (NormalizeFlagNames: the launcher re-executes this argv for its ranks);
// with `help`, --help (or --helpshort, -h) prints help() to stdout and exits
// 0; when CheckFlagArgs finds a problem, prints "<program>: <problem>" lines
// to stderr and exits 2, before any work; then absl::ParseCommandLine (which
// handles --helpfull, --flagfile, --version). Returns the positional
// arguments, argv[0] first.
std::vector<char*> ParseCommandLine(int argc, char** argv, const HelpText& help = nullptr);

// Paths a user gives to `bazel run` are relative to where they ran it
// ($BUILD_WORKING_DIRECTORY), not to the runfiles folder the binary starts
// in. Absolute and empty paths, and runs outside `bazel run`, are unchanged.
std::string ResolveUserPath(const std::string& path);

// Owns the rewritten strings and exposes them as a mutable argv for
// absl::ParseCommandLine.
class NormalizedArgv {
 public:
  NormalizedArgv(int argc, char** argv);
  int argc() const { return static_cast<int>(ptrs_.size()) - 1; }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> args_;
  std::vector<char*> ptrs_;
};

}  // namespace loom::core

#endif  // LOOM_CORE_CLI_H_
