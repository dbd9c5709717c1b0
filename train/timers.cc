#include "train/timers.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::train {
namespace {

struct TimerSpec {
  const char* name;
  int level;
  const char* category;
};

// Megatron's names and levels (training.py, schedules.py, p2p_communication.py).
constexpr TimerSpec kTimers[kNumTimers] = {
    {"save-checkpoint", 0, "checkpoint"},
    {"forward-backward", 1, "step"},
    {"optimizer", 1, "optimizer"},
    {"grads-all-reduce", 1, "comm"},
    {"grads-reduce-scatter", 1, "comm"},
    {"params-all-gather", 1, "comm"},
    {"forward-compute", 2, "compute"},
    {"backward-compute", 2, "compute"},
    {"batch-generator", 2, "data"},
    {"forward-recv", 2, "p2p"},
    {"forward-send", 2, "p2p"},
    {"backward-recv", 2, "p2p"},
    {"backward-send", 2, "p2p"},
    {"forward-send-forward-recv", 2, "p2p"},
    {"forward-send-backward-recv", 2, "p2p"},
    {"backward-send-forward-recv", 2, "p2p"},
    {"backward-send-backward-recv", 2, "p2p"},
    {"forward-backward-send-forward-backward-recv", 2, "p2p"},
};

int64_t MonotonicNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace

const char* TimerName(TimerId id) { return kTimers[static_cast<int>(id)].name; }
int TimerLevel(TimerId id) { return kTimers[static_cast<int>(id)].level; }
const char* TimerCategory(TimerId id) { return kTimers[static_cast<int>(id)].category; }

Timers::Timers(int log_level, Clock clock) : log_level_(log_level), clock_(std::move(clock)) {}

int64_t Timers::Now() const { return clock_ ? clock_() : MonotonicNs(); }

void Timers::Start(TimerId id) {
  if (!On(id)) return;
  Timer& t = timers_[static_cast<int>(id)];
  if (t.running) return;
  t.running = true;
  t.started_ns = Now();
}

void Timers::Stop(TimerId id, const std::string& args) {
  Timer& t = timers_[static_cast<int>(id)];
  if (!t.running) return;
  const int64_t now = Now();
  t.running = false;
  t.ran = true;
  t.elapsed_ns += now - t.started_ns;
  if (profiler_ != nullptr && profiler_->active()) {
    profiler_->AddSpan(TimerName(id), TimerCategory(id), "main", t.started_ns / 1e3, now / 1e3,
                       args);
  }
}

double Timers::Elapsed(TimerId id, bool reset) {
  Timer& t = timers_[static_cast<int>(id)];
  double s = t.elapsed_ns / 1e9;
  if (t.running) s += (Now() - t.started_ns) / 1e9;  // Megatron: a running timer counts so far
  if (reset) {
    t.elapsed_ns = 0;
    t.ran = false;
    if (t.running) t.started_ns = Now();
  }
  return s;
}

std::vector<TimerId> Timers::IntervalTimers() const {
  std::vector<TimerId> ids;
  for (int i = 0; i < kNumTimers; ++i) {
    const TimerId id = static_cast<TimerId>(i);
    if (id != TimerId::kSaveCheckpoint && TimerLevel(id) <= log_level_) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<TimerMinMax>> Timers::MinMaxAcrossRanks(
    comm::Communicator* world, const std::vector<TimerId>& ids, double normalizer, bool reset) {
  const int n = static_cast<int>(ids.size());
  std::vector<TimerMinMax> out;
  if (n == 0) return out;
  // [t_0 .. t_n-1, -t_0 .. -t_n-1] reduced with MAX: max(t) and -min(t). A
  // rank that never ran a timer sends 0 and -inf: it moves neither.
  absl::StatusOr<core::Tensor> host = core::Tensor::Empty(core::Shape{2 * n}, core::DType::kF64);
  if (!host.ok()) return host.status();
  double* v = host->data<double>();
  for (int i = 0; i < n; ++i) {
    const bool ran = Ran(ids[i]);
    const double t = Elapsed(ids[i], reset);
    v[i] = ran ? t : 0;
    v[n + i] = ran ? -t : -std::numeric_limits<double>::infinity();
  }
  if (world != nullptr && world->size() > 1) {
    // A device backend (NCCL) reduces device memory: there and back.
    absl::StatusOr<core::Tensor> t = world->device().is_cpu() ? host : host->To(world->device());
    if (!t.ok()) return t.status();
    absl::Status s = world->AllReduce(*t, comm::ReduceOp::kMax)->Wait();
    if (!s.ok()) return s;
    if (!world->device().is_cpu()) {
      host = t->To(core::Device::CPU());
      if (!host.ok()) return host.status();
      v = host->data<double>();
    }
  }
  const double scale = 1000.0 / std::max(normalizer, 1e-300);
  for (int i = 0; i < n; ++i) {
    if (!(v[n + i] > -std::numeric_limits<double>::infinity())) continue;  // no rank ran it
    out.push_back({ids[i], -v[n + i] * scale, v[i] * scale});
  }
  return out;
}

std::vector<std::string> Timers::Format(const std::vector<TimerMinMax>& times) {
  std::vector<std::string> lines;
  if (times.empty()) return lines;
  lines.push_back("(min, max) time across ranks (ms):");
  for (const TimerMinMax& t : times) {
    std::string name = absl::StrCat(TimerName(t.id), " ");
    if (name.size() < 48) name.append(48 - name.size(), '.');
    lines.push_back(absl::StrFormat("    %s: (%.2f, %.2f)", name, t.min_ms, t.max_ms));
  }
  return lines;
}

TimerId ExecutorTimers::TimerOf(const pipeline::Action* actions, int count) {
  using pipeline::ActionKind;
  if (count == 1 && actions[0].kind == ActionKind::kForward) return TimerId::kForwardCompute;
  // A split backward's halves (BackwardInput, BackwardWeight) are backward compute too.
  if (count == 1 && pipeline::IsBackward(actions[0].kind)) return TimerId::kBackwardCompute;
  bool sf = false, rf = false, sb = false, rb = false;
  for (int i = 0; i < count; ++i) {
    switch (actions[i].kind) {
      case ActionKind::kSendActivation: sf = true; break;
      case ActionKind::kRecvActivation: rf = true; break;
      case ActionKind::kSendGrad: sb = true; break;
      case ActionKind::kRecvGrad: rb = true; break;
      default: break;
    }
  }
  if ((sf || rf) && (sb || rb) && (sf + rf + sb + rb) > 2) {
    return TimerId::kForwardBackwardSendForwardBackwardRecv;
  }
  if (sf && rf) return TimerId::kForwardSendForwardRecv;
  if (sf && rb) return TimerId::kForwardSendBackwardRecv;
  if (sb && rf) return TimerId::kBackwardSendForwardRecv;
  if (sb && rb) return TimerId::kBackwardSendBackwardRecv;
  if (sf) return TimerId::kForwardSend;
  if (rf) return TimerId::kForwardRecv;
  if (sb) return TimerId::kBackwardSend;
  return TimerId::kBackwardRecv;
}

void ExecutorTimers::Begin(const pipeline::Action* actions, int count) {
  timers_->Start(TimerOf(actions, count));
  if (!timers_->profiling() || count != 1 || !pipeline::IsCompute(actions[0].kind)) return;
  in_compute_ = true;
  unit_start_us_.clear();
  kind_ = actions[0].kind;
  last_us_ = profile::NowUs();
  args_ = absl::StrCat("{\"micro_batch\":", actions[0].micro_batch, ",\"chunk\":",
                       actions[0].chunk, "}");
}

std::string ExecutorTimers::UnitName(int64_t unit) const {
  if (unit < 0) return "embedding";
  if (unit == head_unit_) return "output-layer";
  return absl::StrCat("layer ", unit);
}

absl::Status ExecutorTimers::BeforeForward(int64_t unit) {
  if (Tracing()) unit_start_us_[unit] = profile::NowUs();
  return absl::OkStatus();
}

absl::Status ExecutorTimers::AfterForward(int64_t unit) {
  auto it = unit_start_us_.find(unit);
  if (!Tracing() || it == unit_start_us_.end()) return absl::OkStatus();
  timers_->profiler()->AddSpan(absl::StrCat("forward ", UnitName(unit)), "compute", "main",
                               it->second, profile::NowUs(), args_);
  unit_start_us_.erase(it);
  return absl::OkStatus();
}

absl::Status ExecutorTimers::BeforeBackward(int64_t unit) { return BeforeForward(unit); }

absl::Status ExecutorTimers::AfterBackward(int64_t unit) {
  if (!Tracing()) return absl::OkStatus();
  auto it = unit_start_us_.find(unit);
  if (it == unit_start_us_.end()) {
    if (kind_ != pipeline::ActionKind::kBackwardWeight) return absl::OkStatus();
    // A split backward's W: the unit's weight gradients ran since the last event.
    const double now = profile::NowUs();
    timers_->profiler()->AddSpan(absl::StrCat("backward-weight ", UnitName(unit)), "compute",
                                 "main", last_us_, now, args_);
    last_us_ = now;
    return absl::OkStatus();
  }
  timers_->profiler()->AddSpan(absl::StrCat("backward ", UnitName(unit)), "compute", "main",
                               it->second, profile::NowUs(), args_);
  unit_start_us_.erase(it);
  return absl::OkStatus();
}

void ExecutorTimers::End(const pipeline::Action* actions, int count) {
  const TimerId id = TimerOf(actions, count);
  const bool compute = count == 1 && pipeline::IsCompute(actions[0].kind);
  if (compute && in_compute_ && kind_ == pipeline::ActionKind::kBackwardInput) {
    // A split backward's I: its units began and end at W; each span runs to
    // the next unit's beginning (a recomputed run's, to the end of the run).
    std::vector<std::pair<double, int64_t>> open;
    for (const auto& [unit, start] : unit_start_us_) open.push_back({start, unit});
    std::sort(open.begin(), open.end());
    const double now = profile::NowUs();
    for (size_t i = 0; i < open.size(); ++i) {
      timers_->profiler()->AddSpan(absl::StrCat("backward-input ", UnitName(open[i].second)),
                                   "compute", "main", open[i].first,
                                   i + 1 < open.size() ? open[i + 1].first : now, args_);
    }
    unit_start_us_.clear();
  }
  if (compute && in_compute_) in_compute_ = false;
  std::string args;  // the span's: only when it becomes one
  if (timers_->profiling()) {
    if (compute) {
      args = args_;
    } else {
      std::vector<std::string> names;
      for (int i = 0; i < count; ++i) names.push_back(pipeline::ToShortString(actions[i]));
      args = absl::StrCat("{\"actions\":\"", absl::StrJoin(names, " "), "\"}");
    }
  }
  timers_->Stop(id, args);
}

}  // namespace loom::train
