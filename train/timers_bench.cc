// `bazel run //train:timers_bench`: what a timer costs per Start/Stop pair
// (train/timers.h) off (above --timing-log-level: the default for every
// timer but save-checkpoint), on, and on while a --profile window is open
// (each pair is also a span), and a comm op's span (the flight recorder's
// sink) with the window open. Median of --repeats runs; ns per pair.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "comm/comm.h"
#include "comm/local/communicator.h"
#include "comm/testing/ranks_as_threads.h"
#include "core/bench_util/bench_util.h"
#include "profile/profiler.h"
#include "train/timers.h"

ABSL_FLAG(int, pairs, 2000000, "Start/Stop pairs per run");
ABSL_FLAG(int, repeats, 5, "Runs per figure (the median is printed)");

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double MedianNs(int n, int repeats, F f) {
  std::vector<double> runs;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) f(i);
    runs.push_back(loom::core::bench::MillisecondsSince(t0) * 1e6 / n);
  }
  return loom::core::bench::Median(runs);
}

int Main() {
  const int n = absl::GetFlag(FLAGS_pairs), repeats = absl::GetFlag(FLAGS_repeats);
  Timers off(0), on(2);
  const double off_ns = MedianNs(n, repeats, [&](int) {
    off.Start(TimerId::kForwardCompute);
    off.Stop(TimerId::kForwardCompute);
  });
  const double on_ns = MedianNs(n, repeats, [&](int) {
    on.Start(TimerId::kForwardCompute);
    on.Stop(TimerId::kForwardCompute);
  });
  double span_ns = 0, comm_ns = 0, comm_off_ns = 0;
  const int spans = std::min(n, 200000);  // each keeps a span in memory
  absl::Status s = comm::testing::RunRanksAsThreads(1, [&](int rank, comm::Communicator* c) {
    core::Tensor t = *core::Tensor::Empty({1}, core::DType::kF32);
    comm_off_ns = MedianNs(spans / 10, repeats, [&](int) {
      c->AllReduce(t, comm::ReduceOp::kSum)->Wait().IgnoreError();
    });
    profile::ProfileOptions o;
    o.dir = "/tmp/loom_timers_bench";
    o.step_start = 0;
    o.step_end = 1;
    auto p = profile::Profiler::Create(o, rank);
    if (!p.ok()) return p.status();
    absl::Status st = (*p)->BeforeStep(0, c);
    if (!st.ok()) return st;
    Timers prof(0);
    prof.set_profiler(p->get());
    span_ns = MedianNs(spans, repeats, [&](int) {
      prof.Start(TimerId::kForwardCompute);
      prof.Stop(TimerId::kForwardCompute);
    });
    comm_ns = MedianNs(spans / 10, repeats, [&](int) {
      c->AllReduce(t, comm::ReduceOp::kSum)->Wait().IgnoreError();
    });
    return absl::OkStatus();  // the window stays open: nothing written
  });
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("timer Start+Stop, ns per pair (median of %d runs):\n", repeats);
  std::printf("  off (above --timing-log-level)        %8.2f\n", off_ns);
  std::printf("  on (at or below the level)            %8.2f\n", on_ns);
  std::printf("  on, --profile window open (a span)    %8.2f\n", span_ns);
  std::printf("local 1-rank 4-byte all-reduce, ns per op:\n");
  std::printf("  no profiler (sink not installed)      %8.2f\n", comm_off_ns);
  std::printf("  --profile window open (a comm span)   %8.2f\n", comm_ns);
  return 0;
}

}  // namespace
}  // namespace loom::train

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::train::Main();
}
