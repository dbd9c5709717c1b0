// Helper for launcher_test.sh. It decides like //train:gpt (launch::PlanLaunch):
// with --nproc-per-node (and nobody else having started it) it is its own
// launcher; started by a launcher's variables or --rank/--world-size it is one
// rank; an explicit --nproc-per-node > 1 with those is an error (exit 2).
// Each rank then does --behavior:
//   store:   rendezvous through the TCP store (MASTER_ADDR/PORT, waiting up
//            to --comm-timeout-s) and check every rank's key; exit 0.
//   fail:    rank 1 exits with status 3 after 0.5 s; the others sleep long.
//   sigkill: rank 2 kills itself; the others sleep long.
//   sleep:   every rank writes its pid to --pid_dir and sleeps long.
//   fail_once:   rank --fail_rank exits with status 3 on the first start
//                (LOOM_RESTART_COUNT=0), then every rank does `store`.
//   fail_always: rank --fail_rank exits with status 3 on every start.
//   hang:    rank --fail_rank beats once, then never again; the others beat.
//   beat:    every rank writes its pid to --pid_dir and beats every 100 ms.
//   preempt: as `sleep`, but the ranks outlive SIGTERM (as under
//            --exit-signal-handler) except rank 1, which exits with status 3
//            on it; the launcher gives the ranks --signal_grace_s to end.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "comm/launch/discovery.h"
#include "comm/launch/flags.h"
#include "comm/launch/heartbeat.h"
#include "comm/launch/launcher.h"
#include "comm/launch/plan.h"
#include "comm/store/tcp_store.h"

ABSL_FLAG(std::string, behavior, "store", "store, fail, sigkill or sleep");
ABSL_FLAG(std::string, pid_dir, "", "where `sleep` and `beat` write pids");
ABSL_FLAG(int, fail_rank, 1, "the rank that fails or hangs");
ABSL_FLAG(int, signal_grace_s, 0, "if > 0: how long the launcher waits for ranks after a signal");

namespace {
void ExitThree(int) { _exit(3); }
}  // namespace

int main(int argc, char** argv) {
  using namespace loom::comm;
  launch::ParseFlags(argc, argv, "launcher test child");
  launch::CommFlags flags = launch::GetCommFlags();
  if (absl::Status s = launch::CheckAgentFlags(flags); !s.ok()) {
    std::cerr << "plan: " << s.message() << std::endl;
    return 2;
  }
  launch::LaunchRequest request = launch::LaunchRequestFor(flags);
  request.backend = "ucx";  // processes (nothing here creates a communicator)
  auto plan = launch::PlanLaunch(request);
  if (!plan.ok()) {
    std::cerr << "plan: " << plan.status().message() << std::endl;
    return 2;
  }
  if (plan->role == launch::Role::kLauncher) {
    launch::LaunchOptions o = launch::LaunchOptionsFor(flags, *plan);
    o.kill_grace = absl::Seconds(2);
    if (absl::GetFlag(FLAGS_signal_grace_s) > 0) {
      o.signal_grace = absl::Seconds(absl::GetFlag(FLAGS_signal_grace_s));
    }
    absl::Status s = launch::LaunchAndWait(o, argc, argv);
    std::cout << "launcher: " << (s.ok() ? "OK" : s.ToString()) << std::endl;
    return s.ok() ? 0 : 1;
  }
  const launch::RankInfo* info = &plan->rank;
  std::string b = absl::GetFlag(FLAGS_behavior);
  const bool failing = info->rank == absl::GetFlag(FLAGS_fail_rank);
  launch::Beat(0, launch::Phase::kSetup);
  if (b == "fail_once") {
    if (failing && launch::RestartCount() == 0) {
      absl::SleepFor(absl::Milliseconds(500));
      return 3;
    }
    b = "store";
  }
  if (b == "fail_always" && failing) {
    absl::SleepFor(absl::Milliseconds(500));
    return 3;
  }
  if (b == "hang" || b == "beat") {
    if (b == "beat") {
      std::ofstream(absl::StrCat(absl::GetFlag(FLAGS_pid_dir), "/", getpid())) << info->rank;
    }
    for (int i = 0; i < 1200; ++i) {
      if (b == "beat" || !failing || i == 0) launch::Beat(i, launch::Phase::kTrain);
      absl::SleepFor(absl::Milliseconds(100));
    }
    return 0;
  }
  if (b == "store") {
    TcpStoreOptions o;
    o.host = info->master_addr;
    o.port = info->master_port;
    o.is_server = info->rank == 0;
    o.connect_timeout = absl::Seconds(flags.timeout_s);
    o.secret = flags.rendezvous_secret;
    auto store = TcpStore::Create(o);
    if (!store.ok()) {
      std::cerr << store.status() << std::endl;
      return 2;
    }
    (*store)->Set(absl::StrCat("rank/", info->rank), absl::StrCat(getpid())).IgnoreError();
    absl::Status s =
        StoreBarrier(**store, "all", info->world_size, absl::Seconds(flags.timeout_s));
    if (!s.ok()) {
      std::cerr << s << std::endl;
      return 3;
    }
    for (int r = 0; r < info->world_size; ++r) {
      if (!(*store)->Get(absl::StrCat("rank/", r), absl::Seconds(5)).ok()) return 4;
    }
    // Rank 0 serves: it leaves last.
    s = StoreBarrier(**store, "done", info->world_size, absl::Seconds(flags.timeout_s));
    if (info->rank == 0) absl::SleepFor(absl::Milliseconds(200));
    std::cout << "rank " << info->rank << " of " << info->world_size << " (" << info->source
              << ", local " << info->local_rank << " of " << info->local_world_size
              << ") rendezvoused" << std::endl;
    return s.ok() ? 0 : 5;
  }
  if (b == "fail" && info->rank == 1) {
    absl::SleepFor(absl::Milliseconds(500));
    return 3;
  }
  if (b == "sigkill" && info->rank == 2) {
    absl::SleepFor(absl::Milliseconds(500));
    raise(SIGKILL);
  }
  if (b == "preempt") signal(SIGTERM, info->rank == 1 ? ExitThree : SIG_IGN);
  if (b == "sleep" || b == "preempt") {
    std::ofstream(absl::StrCat(absl::GetFlag(FLAGS_pid_dir), "/", getpid())) << info->rank;
  }
  absl::SleepFor(absl::Seconds(120));
  return 0;
}
