// The conformance suite as a multi-process binary (mpi, ucx backends):
//   mpirun -np 3 conformance_main --backend=mpi
//   conformance_main --backend=ucx --nproc-per-node=3
// --mode=dead_peer: the last rank kills itself (SIGKILL) after a barrier; the
// others must fail with DeadlineExceeded within --comm-timeout-s + 5 s.
// --mode=failed_op: the failed-op case (testing::FailedOpKeepsBuffers) with
// --comm-timeout-s as the op timeout (a few seconds).
// Prints one line per case and rank; exits non-zero if any case failed.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/backend_registry.h"
#include "comm/backends.h"
#include "comm/launch/flags.h"
#include "comm/launch/run_ranks.h"
#include "comm/testing/conformance.h"

ABSL_FLAG(std::string, mode, "suite", "suite, dead_peer or failed_op");
ABSL_FLAG(std::string, only, "", "Run only the case with this name.");

namespace loom::comm {
namespace {

// One rank's run: the case(s) --mode names, on this rank's world. What the
// backend is expected to do comes from the registry (ConformanceTraits).
absl::Status RunRank(Communicator& c, const launch::CommFlags& flags) {
  const ConformanceTraits& traits = FindBackend(flags.backend)->conformance;
  const std::string who = absl::StrCat("[", flags.backend, " rank ", c.rank(), "/", c.size(), "] ");
  if (absl::GetFlag(FLAGS_mode) == "dead_peer") {
    std::string observed;
    absl::Status s = testing::DeadPeer(
        c, c.size() - 1, [] { raise(SIGKILL); }, absl::Seconds(flags.timeout_s), absl::Seconds(5),
        traits.names_missing_ranks, &observed);
    std::cout << who << (s.ok() ? "DEAD_PEER_OK " + observed : "DEAD_PEER_FAIL " + s.ToString())
              << std::endl;
    std::fflush(nullptr);
    _exit(s.ok() ? 0 : 1);  // the world is broken: do not finalize it
  }
  if (absl::GetFlag(FLAGS_mode) == "failed_op") {
    absl::Status s = testing::FailedOpKeepsBuffers(c, absl::Seconds(flags.timeout_s));
    std::cout << who << (s.ok() ? "FAILED_OP_OK" : "FAILED_OP_FAIL " + s.ToString()) << std::endl;
    std::fflush(nullptr);
    // MPI: rank 0's failed all-reduce stays pending forever; do not finalize.
    if (traits.one_world_per_process) _exit(s.ok() ? 0 : 1);
    return s;  // the caller destroys what the failed ops left with the transport
  }
  testing::SuiteOptions so;
  so.detects_mismatch = traits.detects_mismatch;
  int failed = 0;
  for (const testing::Case& k : testing::Cases(so)) {
    if (!absl::GetFlag(FLAGS_only).empty() && k.name != absl::GetFlag(FLAGS_only)) continue;
    absl::Time t0 = absl::Now();
    absl::Status s = k.body(c);
    std::cout << who << (s.ok() ? "[ OK ] " : "[FAIL] ") << k.name << " ("
              << absl::FormatDuration(absl::Now() - t0) << ")" << (s.ok() ? "" : ": ")
              << (s.ok() ? "" : s.ToString()) << std::endl;
    if (!s.ok()) ++failed;
  }
  // Second init is an error, not a crash.
  if (traits.one_world_per_process) {
    BackendOptions o;
    auto again = Create(flags.backend, o);
    if (again.ok() || !absl::IsFailedPrecondition(again.status())) {
      std::cout << who << "[FAIL] SecondInit: expected FailedPrecondition, got "
                << again.status() << std::endl;
      ++failed;
    } else {
      std::cout << who << "[ OK ] SecondInit" << std::endl;
    }
  }
  absl::Status s = c.Barrier()->Wait();
  if (!s.ok()) {
    std::cout << who << "[FAIL] final barrier: " << s << std::endl;
    ++failed;
  }
  return failed == 0 ? absl::OkStatus()
                     : absl::InternalError(absl::StrCat(failed, " case(s) failed"));
}

int Main(int argc, char** argv) {
  launch::ParseFlags(argc, argv, "comm conformance suite on a multi-process backend");
  const launch::CommFlags flags = launch::GetCommFlags();
  bool ran = false;  // a rank's world was created and the cases ran
  launch::RanksOutcome out = launch::RunRanks(
      flags, {}, argc, argv, [&](Communicator& c, const launch::RankContext&) {
        ran = true;
        return RunRank(c, flags);
      });
  if (out.role == launch::Role::kLauncher) {
    std::cout << (out.status.ok() ? "all ranks passed" : out.status.ToString()) << std::endl;
  } else if (!out.status.ok() && !ran) {
    std::cerr << "cannot create the " << flags.backend << " world: " << out.status << std::endl;
    return 2;
  }
  return out.ExitCode();
}

}  // namespace
}  // namespace loom::comm

int main(int argc, char** argv) { return loom::comm::Main(argc, argv); }
