// A helper for the flight recorder's process tests (stall_test.sh), one rank
// per process on a multi-process backend (ucx, mpi):
//   stall_main --backend=ucx --comm-timeout-s=2 --flight-recorder-dir=DIR
//              --stop-rank=1 --stop-after=3 --pid-file=FILE
// Every rank splits the world into 'tp' groups of two and runs iterations of
// (world all-reduce, tp all-reduce). Rank --stop-rank stops issuing before
// iteration --stop-after: it writes its pid to --pid-file and waits (up to
// 60 s) until its own dump appears (the test sends it SIGUSR1), then prints
// "[rank r] STOPPED_RANK_DUMPED". The others time out: they print
// "[rank r] TIMED_OUT" once the failure's dump is written. Every rank exits
// with _exit (a world with a missing rank is broken on purpose: no
// MPI_Finalize, no UCX teardown waiting for peers).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/backends.h"
#include "comm/flight/recorder.h"
#include "comm/launch/flags.h"
#include "core/tensor.h"

ABSL_FLAG(int, stop_rank, 1, "The rank that stops issuing collectives.");
ABSL_FLAG(int, stop_after, 3, "Iterations it runs before it stops.");
ABSL_FLAG(int, iterations, 6, "Iterations the other ranks try.");
ABSL_FLAG(std::string, pid_file, "", "Where the stopped rank writes its pid.");

namespace loom::comm {
namespace {

[[noreturn]] void Exit(int rank, const std::string& what, int code) {
  std::printf("[rank %d] %s\n", rank, what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

int Main(int argc, char** argv) {
  launch::ParseFlags(argc, argv, "flight recorder test helper: one rank stops issuing");
  launch::CommFlags flags = launch::GetCommFlags();
  auto world = CreateFromFlags(flags);
  if (!world.ok()) Exit(-1, absl::StrCat("FAIL: ", world.status().ToString()), 1);
  Communicator& w = **world;
  const int rank = w.rank();
  auto tp = w.Split(rank / 2, rank, "tp");
  if (!tp.ok()) Exit(rank, absl::StrCat("FAIL: split: ", tp.status().ToString()), 1);
  core::Tensor t = *core::Tensor::Empty({256}, core::DType::kF32);
  for (int i = 0; i < absl::GetFlag(FLAGS_iterations); ++i) {
    if (rank == absl::GetFlag(FLAGS_stop_rank) && i == absl::GetFlag(FLAGS_stop_after)) {
      std::ofstream(absl::GetFlag(FLAGS_pid_file)) << getpid() << "\n";
      std::printf("[rank %d] STOPPED (pid %d)\n", rank, static_cast<int>(getpid()));
      std::fflush(stdout);
      const std::string dump = flight::DumpPath(flags.flight_recorder_dir, rank);
      const absl::Time until = absl::Now() + absl::Seconds(60);
      while (access(dump.c_str(), F_OK) != 0) {
        if (absl::Now() > until) Exit(rank, "FAIL: no dump 60 s after stopping", 1);
        absl::SleepFor(absl::Milliseconds(20));
      }
      absl::SleepFor(absl::Milliseconds(200));  // (the dump is renamed into place whole)
      Exit(rank, "STOPPED_RANK_DUMPED", 0);
    }
    absl::Status s = w.AllReduce(t, ReduceOp::kSum)->Wait();
    if (s.ok()) s = (*tp)->AllReduce(t, ReduceOp::kSum)->Wait();
    if (absl::IsDeadlineExceeded(s)) Exit(rank, absl::StrCat("TIMED_OUT: ", s.message()), 0);
    if (!s.ok()) Exit(rank, absl::StrCat("FAIL: ", s.ToString()), 1);
  }
  Exit(rank, "FAIL: finished every iteration (the stopped rank should have stopped them)", 1);
}

}  // namespace
}  // namespace loom::comm

int main(int argc, char** argv) { return loom::comm::Main(argc, argv); }
