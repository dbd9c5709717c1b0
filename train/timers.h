#ifndef LOOM_TRAIN_TIMERS_H_
#define LOOM_TRAIN_TIMERS_H_

// Megatron's timers (megatron/core/timers.py): named wall-clock timers with
// log levels, reported every --log-interval as Megatron prints them,
//
//   (min, max) time across ranks (ms):
//       forward-backward ...............................: (812.41, 815.03)
//       optimizer ......................................: (20.11, 20.60)
//
// i.e. per iteration over the interval, the smallest and largest over the
// ranks that ran the timer (a rank that never started it is left out),
// gathered with ONE all-reduce (MAX over [t, -t]).
//
// Levels are Megatron's (--timing-log-level, default 0): a timer above the
// level is off (Megatron's dummy timer: Start/Stop do nothing). Level 0:
// save-checkpoint (logged after each save). Level 1: forward-backward,
// optimizer, the gradient reduction (Megatron's all-grads-sync, named after
// what Loom runs: grads-all-reduce, or grads-reduce-scatter under
// --use-distributed-optimizer) and params-all-gather. Level 2: per
// micro-batch forward-compute, backward-compute, batch-generator, and the
// pipeline's point-to-point batches by what they carry (forward-recv,
// forward-send, backward-recv, backward-send, forward-send-backward-recv,
// backward-send-forward-recv, ... as Megatron's p2p_communication names
// them).
//
// With a profiler (profile/profiler.h) whose window is open, every timer,
// whatever its level, also records its start/stop as a span: the code is
// instrumented once.
//
// One Timers per rank, used from the rank's training thread.

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "layers/stage_model.h"
#include "pipeline/executor.h"
#include "profile/profiler.h"

namespace loom::train {

enum class TimerId : int {
  kSaveCheckpoint,
  kForwardBackward,
  kOptimizer,
  kGradsAllReduce,
  kGradsReduceScatter,
  kParamsAllGather,
  kForwardCompute,
  kBackwardCompute,
  kBatchGenerator,
  kForwardRecv,
  kForwardSend,
  kBackwardRecv,
  kBackwardSend,
  kForwardSendForwardRecv,
  kForwardSendBackwardRecv,
  kBackwardSendForwardRecv,
  kBackwardSendBackwardRecv,
  kForwardBackwardSendForwardBackwardRecv,
};
inline constexpr int kNumTimers = 18;
const char* TimerName(TimerId id);  // Megatron's: "forward-backward", ...
int TimerLevel(TimerId id);
// The profile's category of a timer's spans ("compute", "p2p", ...).
const char* TimerCategory(TimerId id);

// A timer's min and max over the ranks, ms per iteration.
struct TimerMinMax {
  TimerId id;
  double min_ms = 0, max_ms = 0;
};

class Timers {
 public:
  // Nanoseconds of a monotonic clock (tests pass their own).
  using Clock = std::function<int64_t()>;
  // `log_level`: --timing-log-level (0, 1, 2). `clock` null: CLOCK_MONOTONIC.
  explicit Timers(int log_level, Clock clock = nullptr);

  int log_level() const { return log_level_; }
  // Spans go to `profiler` while its window is open (null: none).
  void set_profiler(profile::Profiler* profiler) { profiler_ = profiler; }
  profile::Profiler* profiler() const { return profiler_; }
  // A profiler's window is open: timers are spans too.
  bool profiling() const { return profiler_ != nullptr && profiler_->active(); }
  // Whether the timer measures now: at or below the level, or profiling.
  bool On(TimerId id) const {
    return TimerLevel(id) <= log_level_ || (profiler_ != nullptr && profiler_->active());
  }

  // Start twice without Stop, or Stop without Start: ignored (a timer
  // turned on by the profiler's window mid-step).
  void Start(TimerId id);
  // `args`: the span's arguments, a JSON object ("" none), e.g. the micro-batch.
  void Stop(TimerId id, const std::string& args = "");
  // Seconds accumulated since the last reset; `reset` zeroes it.
  double Elapsed(TimerId id, bool reset);
  // Whether the timer ran since the last reset.
  bool Ran(TimerId id) const { return timers_[static_cast<int>(id)].ran; }

  // Timers of this level (--timing-log-level) in Megatron's order, without
  // save-checkpoint (logged after each save); the same list on every rank.
  std::vector<TimerId> IntervalTimers() const;

  // Collective over `world` (every rank calls it with the same `ids`): each
  // timer's min and max over the ranks that ran it, divided by `normalizer`
  // (iterations), in ms; timers no rank ran are left out. One all-reduce.
  // `reset` zeroes the timers afterwards.
  absl::StatusOr<std::vector<TimerMinMax>> MinMaxAcrossRanks(comm::Communicator* world,
                                                             const std::vector<TimerId>& ids,
                                                             double normalizer, bool reset);
  // Megatron's lines: "(min, max) time across ranks (ms):" then one per timer
  // ("    <name> .....: (min, max)"); empty when `times` is.
  static std::vector<std::string> Format(const std::vector<TimerMinMax>& times);

  // Starts in the constructor, stops in the destructor.
  class Scope {
   public:
    Scope(Timers* timers, TimerId id) : timers_(timers), id_(id) { timers_->Start(id_); }
    ~Scope() { timers_->Stop(id_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timers* timers_;
    TimerId id_;
  };

 private:
  struct Timer {
    int64_t elapsed_ns = 0;
    int64_t started_ns = 0;
    bool running = false;
    bool ran = false;
  };
  int64_t Now() const;

  const int log_level_;
  const Clock clock_;
  profile::Profiler* profiler_ = nullptr;
  std::array<Timer, kNumTimers> timers_{};
};

// The executor's actions as timers: Forward -> forward-compute, Backward ->
// backward-compute (span args: micro_batch, chunk), a batch of p2p actions ->
// Megatron's name of what it sends and receives (args: the actions, e.g.
// "SA3.0>1 RG2.0<1").
//
// Per layer (profiling only): a layers::UnitObserver of the model (added
// after GradientSync, so its spans nest inside GradientSync's waits), it
// adds spans "forward layer L" / "backward layer L" ("embedding",
// "output-layer" for the units outside the blocks) inside each
// forward-/backward-compute, from the unit's Before- to its After-event (a
// recomputed run's units all begin their backward before its recomputed
// forward). A split backward (zero-bubble schedules) gives "backward-input
// layer L" spans in its I (each to the next unit's beginning) and
// "backward-weight layer L" in its W (each unit's weight gradients).
class ExecutorTimers : public pipeline::ActionObserver, public layers::UnitObserver {
 public:
  // `head_unit`: StageModel::head_unit() (the output layer's unit id).
  explicit ExecutorTimers(Timers* timers, int64_t head_unit = -2)
      : timers_(timers), head_unit_(head_unit) {}
  void Begin(const pipeline::Action* actions, int count) override;
  void End(const pipeline::Action* actions, int count) override;
  // The model's unit events (only inside a training step's compute actions:
  // evaluation and generation run the model outside the executor's actions).
  absl::Status BeforeForward(int64_t unit) override;
  absl::Status AfterForward(int64_t unit) override;
  absl::Status BeforeBackward(int64_t unit) override;
  absl::Status AfterBackward(int64_t unit) override;
  void set_head_unit(int64_t head_unit) { head_unit_ = head_unit; }
  // The timer of a compute action or a batch.
  static TimerId TimerOf(const pipeline::Action* actions, int count);
  // "layer 3", "embedding", "output-layer".
  std::string UnitName(int64_t unit) const;

 private:
  bool Tracing() const { return timers_->profiling() && in_compute_; }
  Timers* timers_;
  int64_t head_unit_;
  bool in_compute_ = false;                  // between Begin and End of a compute action
  std::map<int64_t, double> unit_start_us_;  // the open units' Before-event times
  std::string args_;                         // the action's span args
  pipeline::ActionKind kind_ = pipeline::ActionKind::kForward;  // the compute action's
  double last_us_ = 0;  // W: the action's beginning, then each unit's AfterBackward
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_TIMERS_H_
