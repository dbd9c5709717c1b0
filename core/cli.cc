#include "core/cli.h"

#include <cstdlib>

namespace loom::core {

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out;
  bool done = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && !done) {
      if (a == "--") {
        done = true;
      } else if (a.size() > 2 && a[0] == '-') {
        size_t start = a[1] == '-' ? 2 : 1;
        size_t end = a.find('=');
        if (end == std::string::npos) end = a.size();
        for (size_t k = start; k < end; ++k) {
          if (a[k] == '-') a[k] = '_';
        }
      }
    }
    out.push_back(a);
  }
  return out;
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
