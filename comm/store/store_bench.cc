// Rendezvous time of the TCP store: N ranks as threads of one process; rank 0
// creates the server, every rank connects (and, since #17, proves the job's
// secret), sets its address and gets everyone else's. Timed from the server's
// start until every rank has every address; median and min of --reps runs.
//
//   bazel run -c opt //comm:store_bench -- --ranks=2,8 --reps=50
//
// For the numbers before #17 the same file is compiled against the store of
// commit 388d996 with -DLOOM_STORE_BENCH_NO_AUTH (that store had no secret);
// see BENCHMARKS.md.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "comm/store/tcp_store.h"
#include "core/bench_util/bench_util.h"

ABSL_FLAG(std::string, ranks, "2,8", "world sizes to time");
ABSL_FLAG(int, reps, 50, "rendezvous per world size");

namespace loom::comm {
namespace {

std::unique_ptr<TcpStore> MakeStore(int port, bool server) {
  TcpStoreOptions o;
  o.port = port;
  o.is_server = server;
#ifndef LOOM_STORE_BENCH_NO_AUTH
  o.secret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
#endif
  auto s = TcpStore::Create(o);
  if (!s.ok()) {
    std::fprintf(stderr, "store_bench: %s\n", std::string(s.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*s);
}

// One rendezvous of n ranks; returns its wall time.
absl::Duration Rendezvous(int n) {
  const absl::Time start = absl::Now();
  std::unique_ptr<TcpStore> server = MakeStore(0, true);
  const int port = server->port();
  std::vector<std::thread> ranks;
  std::vector<int> ok(n, 0);
  auto rank = [&](int r, TcpStore* mine) {
    std::unique_ptr<TcpStore> own;
    if (mine == nullptr) {
      own = MakeStore(port, false);
      mine = own.get();
    }
    if (!mine->Set(absl::StrCat("addr/", r), std::string(600, 'a' + r % 26)).ok()) return;
    for (int q = 0; q < n; ++q) {
      if (!mine->Get(absl::StrCat("addr/", q), absl::Seconds(30)).ok()) return;
    }
    ok[r] = 1;
  };
  for (int r = 1; r < n; ++r) ranks.emplace_back(rank, r, nullptr);
  rank(0, server.get());
  for (auto& t : ranks) t.join();
  const absl::Duration took = absl::Now() - start;
  if (std::count(ok.begin(), ok.end(), 1) != n) {
    std::fprintf(stderr, "store_bench: a rank failed\n");
    std::exit(1);
  }
  return took;
}

}  // namespace
}  // namespace loom::comm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int reps = absl::GetFlag(FLAGS_reps);
#ifdef LOOM_STORE_BENCH_NO_AUTH
  const char* variant = "no auth (388d996)";
#else
  const char* variant = "HMAC handshake (#17)";
#endif
  std::printf("# TCP store rendezvous, ranks as threads; CPU: %s\n",
              loom::core::bench::CpuModel().c_str());
  std::printf("%-22s %6s %6s %12s %12s\n", "store", "ranks", "reps", "median_ms", "min_ms");
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1) continue;
    loom::comm::Rendezvous(n);  // warm-up
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      ms.push_back(absl::ToDoubleMilliseconds(loom::comm::Rendezvous(n)));
    }
    std::printf("%-22s %6d %6d %12.3f %12.3f\n", variant, n, reps, loom::core::bench::Median(ms),
                *std::min_element(ms.begin(), ms.end()));
  }
  return 0;
}
