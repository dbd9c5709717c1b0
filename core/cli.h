#ifndef LOOM_CORE_CLI_H_
#define LOOM_CORE_CLI_H_

#include <string>
#include <vector>

namespace loom::core {

// Megatron spells flags with dashes (--tensor-model-parallel-size); Abseil
// flags are identifiers with underscores. Returns argv with the name part of
// every "--flag-name[=value]" rewritten to "--flag_name[=value]" (values are
// untouched; nothing after a bare "--" is changed), so users can type either.
// This is the only flag-name rewriter in the tree: comm/launch's ParseFlags
// and every binary's main use it.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);
// One argument ("--a-b=c-d" -> "--a_b=c-d"; anything but a flag is returned as is).
std::string NormalizeFlagName(const std::string& arg);

// The name of a flag argument with underscores ("--nproc-per-node=2" and
// "-nproc_per_node" give "nproc_per_node"); "" for a value, a positional
// argument or "--".
std::string FlagName(const std::string& arg);
// The names of the flags in `args` (argv[0] first), up to a bare "--".
std::vector<std::string> FlagNamesIn(const std::vector<std::string>& args);

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
