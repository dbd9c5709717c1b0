// `bazel run //comm/flight:bench`: the flight recorder's cost per collective
// (issue + start + complete records, as the engine makes them) in ns, the
// clocks it could have used, and in the same run the 4-byte all-reduce
// latency of 2 UCX ranks (threads of this process, each its own UCX world
// over shared memory, as //comm/ucx's failure tests run them) and of the
// local backend, with the recorder's share of it.
//   --iterations=N (recorder loop), --allreduces=N (per latency run)
#include <time.h>
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "comm/flight/recorder.h"
#include "comm/local/communicator.h"
#include "comm/store/memory_store.h"
#include "core/tensor.h"
#ifdef LOOM_FLIGHT_BENCH_UCX
#include "comm/ucx/communicator.h"
#endif

ABSL_FLAG(int, iterations, 20000000, "Recorder loop iterations (one collective each).");
ABSL_FLAG(int, allreduces, 20000, "Timed 4-byte all-reduces per latency run.");
ABSL_FLAG(int, repeats, 5, "Runs of each measurement; the median is reported.");

namespace loom::comm::flight {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  int cpus = 0;
  std::string model = "unknown";
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      ++cpus;
      model = line.substr(line.find(':') + 2);
    }
  }
  return absl::StrCat(model, " (", cpus, " logical CPUs)");
}

// ns per (Issue, Start, Complete), as one collective records it.
double RecorderNs(int n) {
  CommInfo info;
  info.group = "bench";
  info.backend = "none";
  auto r = Recorder::Create(info);
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    const uint64_t id = r->Issue(OpKind::kAllReduce, static_cast<uint64_t>(i), core::DType::kF32, 4);
    r->Start(id);
    r->Complete(id, true);
  }
  const auto t1 = Clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

template <typename F>
double ClockNs(int n, F f) {
  uint64_t acc = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) acc += f();
  const auto t1 = Clock::now();
  asm volatile("" : : "r"(acc));
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

// µs per 4-byte all-reduce on rank 0 of 2 (ranks = threads, `make(rank)`
// makes each rank's communicator).
template <typename Make>
double AllReduceUs(int n, Make make) {
  double us = 0;
  bool ok = true;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Communicator>> c = make(rank);
      if (!c.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
        ok = false;
        return;
      }
      core::Tensor t = *core::Tensor::Empty({1}, core::DType::kF32);
      t.data<float>()[0] = 1;
      for (int i = 0; i < 1000; ++i) (*c)->AllReduce(t, ReduceOp::kSum)->Wait().IgnoreError();
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        absl::Status s = (*c)->AllReduce(t, ReduceOp::kSum)->Wait();
        if (!s.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
          ok = false;
          break;
        }
      }
      const auto t1 = Clock::now();
      if (rank == 0) us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
      (*c)->Barrier()->Wait().IgnoreError();
    });
  }
  for (auto& t : threads) t.join();
  return ok ? us : -1;
}

int Main() {
  const int iters = absl::GetFlag(FLAGS_iterations);
  const int reps = std::max(1, absl::GetFlag(FLAGS_repeats));
  const int n = absl::GetFlag(FLAGS_allreduces);
  std::printf("CPU: %s\n\n", CpuModel().c_str());

  std::vector<double> rec;
  for (int i = 0; i < reps; ++i) rec.push_back(RecorderNs(iters));
  const double rec_ns = Median(rec);
  // The quietest run of each (the machine is shared): the ratio compares
  // like with like.
  const double rec_best = *std::min_element(rec.begin(), rec.end());

  const int cn = 10000000;
  std::printf("clock reads (ns each; the recorder reads its own tick three times per op):\n");
  std::printf("  recorder tick (relaxed load) %6.2f\n",
              ClockNs(cn, [] { return NowUs(); }));
  std::printf("  CLOCK_MONOTONIC_COARSE       %6.2f\n", ClockNs(cn, [] {
                timespec t;
                clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
                return static_cast<uint64_t>(t.tv_nsec);
              }));
  std::printf("  rdtsc                        %6.2f\n",
              ClockNs(cn, [] { return static_cast<uint64_t>(__rdtsc()); }));
  std::printf("  CLOCK_MONOTONIC              %6.2f\n\n", ClockNs(cn, [] {
                timespec t;
                clock_gettime(CLOCK_MONOTONIC, &t);
                return static_cast<uint64_t>(t.tv_nsec);
              }));

  std::printf("recorder: issue + start + complete = %.2f ns per collective (best; median %.2f; "
              "%d runs of %d: ",
              rec_best, rec_ns, reps, iters);
  for (double r : rec) std::printf("%.2f ", r);
  std::printf(")\n\n");
  std::printf("%-34s %12s %12s %16s\n", "4-byte all-reduce, 2 ranks", "median", "best",
              "recorder / best");
  // The share against the best run: the fastest all-reduce is where the
  // recorder weighs most.
  auto row = [&](const char* name, const std::vector<double>& runs) {
    if (*std::min_element(runs.begin(), runs.end()) <= 0) {
      std::printf("%-34s %12s\n", name, "failed");
      return;
    }
    const double best = *std::min_element(runs.begin(), runs.end());
    std::printf("%-34s %9.3f us %9.3f us %14.3f %%\n", name, Median(runs), best,
                100.0 * rec_best / (best * 1000.0));
  };
  std::vector<double> lat;
  auto store = std::make_shared<MemoryStore>();
  for (int i = 0; i < reps; ++i) {
    lat.push_back(AllReduceUs(n, [&](int rank) { return local::Create(rank, 2, *store); }));
    store = std::make_shared<MemoryStore>();
  }
  row("local (threads, mailboxes)", lat);
#ifdef LOOM_FLIGHT_BENCH_UCX
  lat.clear();
  for (int i = 0; i < reps; ++i) {
    auto ustore = std::make_shared<MemoryStore>();
    lat.push_back(AllReduceUs(n, [&](int rank) {
      ucx::UcxOptions o;
      o.connect_timeout = absl::Seconds(30);
      return ucx::Create(rank, 2, ustore, o);
    }));
  }
  row("ucx (shared memory)", lat);
#else
  std::printf("ucx: not built on this machine\n");
#endif
  std::printf("\n(%d runs of each; %d all-reduces timed per run; recorder / best = the best "
              "recorder run over the best all-reduce run)\n",
              reps, n);
  return 0;
}

}  // namespace
}  // namespace loom::comm::flight

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::comm::flight::Main();
}
