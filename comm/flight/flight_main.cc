// `bazel run //comm:flight -- DIR`: reads every rank's flight recorder dump
// in DIR (comm/flight/dump.h) and prints, per group, the first operation on
// which the ranks disagree and which rank(s) never issued or never finished
// it (comm/flight/analyze.h).
// Exit status: 0 all agree and nothing is pending, 1 a culprit or an
// unfinished op was found, 2 bad input (no folder, no dump, a bad file).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/flight/analyze.h"
#include "comm/flight/dump.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr,
                 "usage: flight DIR\n"
                 "  DIR: the --flight-recorder-dir of a run (one rank<R>.pid<P>.jsonl per rank)\n"
                 "exit: 0 all ranks agree, 1 found a culprit or an unfinished op, 2 bad input\n");
    return 2;
  }
  std::string dir = argv[1];
  // Under `bazel run` the working directory is the runfiles tree: a relative
  // DIR means the caller's.
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (!dir.empty() && dir[0] != '/' && cwd != nullptr) dir = std::string(cwd) + "/" + dir;
  auto dumps = loom::comm::flight::ReadDumpDir(dir);
  if (!dumps.ok()) {
    std::fprintf(stderr, "flight: %s\n", std::string(dumps.status().message()).c_str());
    return 2;
  }
  for (const auto& d : *dumps) {
    std::printf("rank %d (%s, pid %d on %s): %zu communicator(s), dumped because: %s\n",
                d.world_rank, d.path.c_str(), d.pid, d.host.c_str(), d.comms.size(),
                d.reason.c_str());
  }
  loom::comm::flight::Analysis a = loom::comm::flight::Analyze(*dumps);
  std::fputs(a.Report().c_str(), stdout);
  return a.exit_code();
}
