// The conformance suite on the nccl backend over processes, one per GPU:
//   conformance_main --backend=nccl --nproc-per-node=0   (0: one per GPU)
// --mode=dead_peer (>= 2 GPUs, ranks started by dead_peer_test.sh): the last rank kills itself (SIGKILL) after a
// barrier; the others' all-reduce must fail within --comm-timeout-s + 10 s
// with DeadlineExceeded (the watchdog) or Unavailable (NCCL saw the peer's
// connection close), and the communicator must then refuse work.
// Host tensors of the suite are mirrored to each rank's GPU
// (comm/nccl/host_mirror.h). Without a GPU: prints "SKIPPED: <reason>", exit 0.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/backends.h"
#include "comm/launch/flags.h"
#include "comm/launch/run_ranks.h"
#include "comm/nccl/device_memory.h"
#include "comm/nccl/host_mirror.h"
#include "comm/testing/conformance.h"

ABSL_FLAG(std::string, mode, "suite", "suite or dead_peer");
ABSL_FLAG(std::string, only, "", "Run only the case with this name.");

namespace loom::comm {
namespace {

// The survivors' side of a killed peer (NCCL may report the loss itself).
absl::Status DeadPeer(Communicator& c, absl::Duration timeout) {
  absl::Status s = c.Barrier()->Wait();
  if (!s.ok()) return s;
  if (c.rank() == c.size() - 1) {
    std::fflush(nullptr);
    raise(SIGKILL);
  }
  auto t = core::Tensor::Empty({1000}, core::DType::kF32);
  if (!t.ok()) return t.status();
  absl::Time t0 = absl::Now();
  s = c.AllReduce(*t, ReduceOp::kSum)->Wait();
  absl::Duration took = absl::Now() - t0;
  std::cout << "[nccl rank " << c.rank() << "] after the peer died: " << s << " ["
            << absl::FormatDuration(took) << "]" << std::endl;
  if (s.ok()) return absl::InternalError("all_reduce succeeded without the dead peer");
  if (!absl::IsDeadlineExceeded(s) && !absl::IsUnavailable(s)) {
    return absl::InternalError("expected DeadlineExceeded or Unavailable, got " + s.ToString());
  }
  if (!absl::StrContains(s.message(), "all_reduce")) {
    return absl::InternalError("the error must name the op: " + s.ToString());
  }
  if (took > timeout + absl::Seconds(10)) {
    return absl::InternalError(absl::StrCat("failed only after ", absl::FormatDuration(took)));
  }
  absl::Status again = c.AllReduce(*t, ReduceOp::kSum)->Wait(absl::Seconds(5));
  if (!absl::IsFailedPrecondition(again)) {
    return absl::InternalError("an op after the failure: expected FailedPrecondition, got " +
                               again.ToString());
  }
  return absl::OkStatus();
}

// One rank: the suite (or the dead peer) on this rank's GPU.
absl::Status RunRank(Communicator& world, const launch::CommFlags& flags) {
  // The suite's host tensors go to the GPU; the world itself is RunRanks'.
  std::unique_ptr<Communicator> c =
      nccl::MirrorHostTensors(std::shared_ptr<Communicator>(&world, [](Communicator*) {}));
  const std::string who = absl::StrCat("[nccl rank ", c->rank(), "/", c->size(), " ",
                                       c->device().ToString(), "] ");
  if (absl::GetFlag(FLAGS_mode) == "dead_peer") {
    absl::Status s = DeadPeer(*c, absl::Seconds(flags.timeout_s));
    std::cout << who << (s.ok() ? "DEAD_PEER_OK" : "DEAD_PEER_FAIL " + s.ToString()) << std::endl;
    std::fflush(nullptr);
    _exit(s.ok() ? 0 : 1);  // the communicator is aborted: skip destructors
  }
  testing::SuiteOptions so;
  so.detects_mismatch = false;
  so.p2p_matches_tags = false;
  int failed = 0;
  for (const testing::Case& k : testing::Cases(so)) {
    if (!absl::GetFlag(FLAGS_only).empty() && k.name != absl::GetFlag(FLAGS_only)) continue;
    absl::Time t0 = absl::Now();
    absl::Status s = k.body(*c);
    std::cout << who << (s.ok() ? "[ OK ] " : "[FAIL] ") << k.name << " ("
              << absl::FormatDuration(absl::Now() - t0) << ")" << (s.ok() ? "" : ": ")
              << (s.ok() ? "" : s.ToString()) << std::endl;
    if (!s.ok()) ++failed;
  }
  absl::Status s = c->Barrier()->Wait();
  if (!s.ok()) {
    std::cout << who << "[FAIL] final barrier: " << s << std::endl;
    ++failed;
  }
  return failed == 0 ? absl::OkStatus()
                     : absl::InternalError(absl::StrCat(failed, " case(s) failed"));
}

int Main(int argc, char** argv) {
  launch::ParseFlags(argc, argv, "comm conformance suite on the nccl backend");
  launch::CommFlags flags = launch::GetCommFlags();
  if (flags.backend != "nccl") {
    std::cerr << "conformance_main (comm/nccl) runs --backend=nccl only; use "
                 "//comm/testing:conformance_main for the others" << std::endl;
    return 2;
  }
  absl::StatusOr<int> gpus = nccl::GpuCount();
  if (!gpus.ok()) {
    std::cout << "SKIPPED: no GPU on this machine (" << gpus.status().message() << ")"
              << std::endl;
    return 0;
  }
  const bool dead_peer = absl::GetFlag(FLAGS_mode) == "dead_peer";
  // --nproc-per-node=0: one rank per GPU. The dead peer's ranks are started by
  // hand (dead_peer_test.sh): the agent would stop the survivors as soon as
  // the victim dies, by design.
  if (flags.nproc_per_node == 0) flags.nproc_per_node = *gpus;
  if (dead_peer) flags.nproc_per_node = 1;
  launch::RunRanksOptions options;
  bool skipped = false;
  options.validate = [&](const launch::LaunchPlan& plan) {
    if (dead_peer && plan.world_size > *gpus) {
      std::cout << "SKIPPED: the dead-peer test needs " << plan.world_size
                << " GPUs (NCCL refuses two ranks on one GPU); this machine has " << *gpus
                << std::endl;
      skipped = true;
      return absl::CancelledError("skipped");
    }
    return absl::OkStatus();
  };
  bool ran = false;  // a rank's world was created and the cases ran
  const launch::RanksOutcome out = launch::RunRanks(
      flags, options, argc, argv, [&](Communicator& c, const launch::RankContext&) {
        ran = true;
        return RunRank(c, flags);
      });
  if (skipped) return 0;
  if (out.role == launch::Role::kLauncher) {
    std::cout << (out.status.ok() ? "all ranks passed" : out.status.ToString()) << std::endl;
  } else if (!out.status.ok() && !ran) {
    std::cerr << "cannot create the nccl world: " << out.status << std::endl;
    return 2;
  }
  return out.ExitCode();
}

}  // namespace
}  // namespace loom::comm

int main(int argc, char** argv) { return loom::comm::Main(argc, argv); }
