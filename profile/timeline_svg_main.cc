// Draws a merged profile (trace.json of --profile, or a plan written by
// `bazel run //pipeline:visualize -- --format=chrome`) as an SVG:
//   bazel run //profile:timeline_svg -- prof/trace.json prof/trace.svg ["a title"]
// Relative paths are taken from where `bazel run` was started.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "profile/chrome_trace.h"
#include "profile/trace_svg.h"

namespace {

// A relative path from where `bazel run` was started (core/cli.h's rule).
std::string UserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: timeline_svg TRACE.json OUT.svg [TITLE]\n");
    return 2;
  }
  const std::string trace = UserPath(argv[1]);
  const std::string svg = UserPath(argv[2]);
  std::ifstream in(trace, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read it\n", trace.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<loom::profile::ParsedTrace> t = loom::profile::ParseTrace(text.str(), trace);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
    return 1;
  }
  std::ofstream out(svg, std::ios::binary | std::ios::trunc);
  out << loom::profile::RenderTraceSvg(*t, argc == 4 ? std::string(argv[3]) : trace);
  out.close();
  if (!out) {
    std::fprintf(stderr, "%s: cannot write it\n", svg.c_str());
    return 1;
  }
  std::printf("%s: %zu spans of %zu processes\n", svg.c_str(), t->events.size(),
              t->processes.size());
  return 0;
}
