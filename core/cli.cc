#include "core/cli.h"

#include <cstdlib>

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

}  // namespace

std::string NormalizeFlagName(const std::string& arg) {
  std::string a = arg;
  size_t start, end;
  if (NameSpan(a, &start, &end)) {
    for (size_t k = start; k < end; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
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
  size_t start, end;
  if (!NameSpan(arg, &start, &end)) return "";
  return NormalizeFlagName(arg).substr(start, end - start);
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
