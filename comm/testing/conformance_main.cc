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
#include "comm/backends.h"
#include "comm/launch/flags.h"
#include "comm/launch/launcher.h"
#include "comm/testing/conformance.h"

ABSL_FLAG(std::string, mode, "suite", "suite, dead_peer or failed_op");
ABSL_FLAG(std::string, only, "", "Run only the case with this name.");

namespace loom::comm {
namespace {

int Main(int argc, char** argv) {
  launch::ParseFlags(argc, argv, "comm conformance suite on a multi-process backend");
  launch::CommFlags flags = launch::GetCommFlags();
  if (flags.nproc_per_node > 1 && !launch::IsLaunchedChild()) {
    launch::LaunchOptions lo;
    lo.nproc_per_node = flags.nproc_per_node;
    absl::Status s = launch::LaunchAndWait(lo, argc, argv);
    std::cout << (s.ok() ? "all ranks passed" : s.ToString()) << std::endl;
    return s.ok() ? 0 : 1;
  }
  const bool dead_peer = absl::GetFlag(FLAGS_mode) == "dead_peer";
  std::shared_ptr<Store> store;
  auto world = CreateFromFlags(flags, &store);
  if (!world.ok()) {
    std::cerr << "cannot create the " << flags.backend << " world: " << world.status() << std::endl;
    return 2;
  }
  Communicator& c = **world;
  const std::string who = absl::StrCat("[", flags.backend, " rank ", c.rank(), "/", c.size(), "] ");
  if (dead_peer) {
    std::string observed;
    absl::Status s = testing::DeadPeer(
        c, c.size() - 1, [] { raise(SIGKILL); }, absl::Seconds(flags.timeout_s), absl::Seconds(5),
        flags.backend != "mpi", &observed);
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
    if (flags.backend == "mpi") _exit(s.ok() ? 0 : 1);
    world->reset();  // destroys what the failed ops left with the transport
    return s.ok() ? 0 : 1;
  }
  testing::SuiteOptions so;
  so.detects_mismatch = flags.backend != "mpi";
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
  if (flags.backend == "mpi") {
    BackendOptions o;
    auto again = Create("mpi", o);
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
  world->reset();
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace loom::comm

int main(int argc, char** argv) { return loom::comm::Main(argc, argv); }
