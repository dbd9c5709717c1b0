#ifndef LOOM_TRAIN_STRAGGLER_H_
#define LOOM_TRAIN_STRAGGLER_H_

// --log-straggler (Megatron's flag; its StragglerDetector reduced to what
// Loom measures): every rank times its own compute, and with each log line
// (--log-interval) the ranks' times are all-gathered over the world and
// rank 0 logs ONE line naming the --straggler-minmax-count slowest and
// fastest ranks, their host and their time against the median:
//
//    straggler: iteration 20: median compute 225.1 ms/iteration over 4 ranks; slowest rank 1 (host node-a) 412.0 ms 1.83x; fastest rank 0 (host node-a) 220.6 ms 0.98x
//
// With --straggler-minmax-count=K each list holds min(K, ranks) entries,
// separated by ", " ("slowest rank 1 (...) 412.0 ms 1.83x, rank 3 (...) ...");
// the two lists overlap when 2K exceeds the ranks.
//
// What "compute" is: the wall time of the step's forward-backward (the
// pipeline schedule's forward and backward actions, with batch generation)
// plus the optimizer step, per iteration over the log interval: Megatron's
// forward-backward and optimizer timers (train/timers.h), measured whatever
// --timing-log-level is. It leaves out what the timers separate as waiting
// for other ranks: the gradient reduction (grads-all-reduce or
// grads-reduce-scatter), params-all-gather and the loss's all-reduce, where
// a fast data-parallel rank waits for a slow one. It includes the waits the
// timers cannot separate from the compute: tensor/sequence/context/expert
// parallel collectives inside the layers, pipeline point-to-point and
// bubbles, --overlap-param-gather's waits and the gradient-norm all-reduce.
// So a slow rank stands out against its data-parallel peers, but inside a TP
// (or CP, PP) group its partners wait for it in the model's own collectives
// and look about as slow: then the report names the group, not the GPU.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"

namespace loom::train {

// One rank in a report.
struct RankTime {
  int rank = 0;
  double ms = 0;        // compute per iteration
  double slowdown = 1;  // ms / the median (1 when both are 0, inf when only the median is)
  std::string host;     // "" unknown
};

struct StragglerReport {
  int64_t iteration = 0;
  int ranks = 0;
  double median_ms = 0;
  std::vector<RankTime> slowest;  // slowest first; equal times: lower rank first
  std::vector<RankTime> fastest;  // fastest first; equal times: lower rank first
};

// The median (the mean of the two middle values for an even count; 0 for none).
double Median(std::vector<double> values);

// Pure: the report for per-rank compute times `ms` (index = global rank, ms
// per iteration, at least one) with `hosts` ("" or none: not shown; else one
// per rank); each list holds min(minmax_count, ranks) entries.
StragglerReport MakeStragglerReport(int64_t iteration, const std::vector<double>& ms,
                                    const std::vector<std::string>& hosts, int minmax_count);

// The log line above (no trailing newline; starts with a space, as Loom's
// log lines below the iteration line do).
std::string FormatStragglerReport(const StragglerReport& report);

// One rank's side: accumulates the compute time between Start() and Stop()
// and reports it at the log interval. Off (enabled false): every call costs
// a branch and Report() returns an empty report without communicating.
class StragglerDetector {
 public:
  // Nanoseconds of a monotonic clock (tests pass their own).
  using Clock = std::function<int64_t()>;
  // `enabled`: --log-straggler; `minmax_count`: --straggler-minmax-count.
  StragglerDetector(bool enabled, int minmax_count, Clock clock = nullptr);

  bool enabled() const { return enabled_; }
  // Brackets one compute region (forward-backward, optimizer). Start twice
  // without Stop, or Stop without Start: ignored.
  void Start();
  void Stop();

  // Collective over `world` when enabled (every rank, at the same
  // iterations): the compute since the last Report, divided by
  // `iterations`, gathered from every rank (one all-gather of a double; the
  // host names once, at the first report), and the report every rank gets.
  // Resets the accumulated time. Disabled: ranks == 0, nothing sent.
  absl::StatusOr<StragglerReport> Report(comm::Communicator* world, int64_t iteration,
                                         int64_t iterations);

 private:
  int64_t Now() const;

  const bool enabled_;
  const int minmax_count_;
  const Clock clock_;
  int64_t elapsed_ns_ = 0;
  int64_t started_ns_ = 0;
  bool running_ = false;
  std::vector<std::string> hosts_;  // by global rank, after the first report
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_STRAGGLER_H_
