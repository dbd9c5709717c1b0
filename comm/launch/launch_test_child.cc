// Helper for launcher_test.sh. With --nproc-per-node it is its own launcher;
// each rank then does --behavior:
//   store:   rendezvous through the TCP store (MASTER_ADDR/PORT) and check
//            every rank's key; exit 0.
//   fail:    rank 1 exits with status 3 after 0.5 s; the others sleep long.
//   sigkill: rank 2 kills itself; the others sleep long.
//   sleep:   every rank writes its pid to --pid_dir and sleeps long.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "comm/launch/discovery.h"
#include "comm/launch/flags.h"
#include "comm/launch/launcher.h"
#include "comm/store/tcp_store.h"

ABSL_FLAG(std::string, behavior, "store", "store, fail, sigkill or sleep");
ABSL_FLAG(std::string, pid_dir, "", "where `sleep` writes pids");

int main(int argc, char** argv) {
  using namespace loom::comm;
  launch::ParseFlags(argc, argv, "launcher test child");
  launch::CommFlags flags = launch::GetCommFlags();
  if (flags.nproc_per_node > 1 && !launch::IsLaunchedChild()) {
    launch::LaunchOptions o;
    o.nproc_per_node = flags.nproc_per_node;
    o.kill_grace = absl::Seconds(2);
    absl::Status s = launch::LaunchAndWait(o, argc, argv);
    std::cout << "launcher: " << (s.ok() ? "OK" : s.ToString()) << std::endl;
    return s.ok() ? 0 : 1;
  }
  auto info = launch::DiscoverRank(flags.rank);
  if (!info.ok()) {
    std::cerr << info.status() << std::endl;
    return 2;
  }
  const std::string b = absl::GetFlag(FLAGS_behavior);
  if (b == "store") {
    TcpStoreOptions o;
    o.host = info->master_addr;
    o.port = info->master_port;
    o.is_server = info->rank == 0;
    o.connect_timeout = absl::Seconds(20);
    auto store = TcpStore::Create(o);
    if (!store.ok()) {
      std::cerr << store.status() << std::endl;
      return 2;
    }
    (*store)->Set(absl::StrCat("rank/", info->rank), absl::StrCat(getpid())).IgnoreError();
    absl::Status s = StoreBarrier(**store, "all", info->world_size, absl::Seconds(20));
    if (!s.ok()) {
      std::cerr << s << std::endl;
      return 3;
    }
    for (int r = 0; r < info->world_size; ++r) {
      if (!(*store)->Get(absl::StrCat("rank/", r), absl::Seconds(5)).ok()) return 4;
    }
    // Rank 0 serves: it leaves last.
    s = StoreBarrier(**store, "done", info->world_size, absl::Seconds(20));
    if (info->rank == 0) absl::SleepFor(absl::Milliseconds(200));
    std::cout << "rank " << info->rank << " of " << info->world_size << " (" << info->source
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
  if (b == "sleep") {
    std::ofstream(absl::StrCat(absl::GetFlag(FLAGS_pid_dir), "/", getpid())) << info->rank;
  }
  absl::SleepFor(absl::Seconds(120));
  return 0;
}
