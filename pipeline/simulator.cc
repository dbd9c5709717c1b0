#include "pipeline/simulator.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::pipeline {
namespace {

constexpr double kNotYet = -1.0;

// One direction of a point-to-point link, src -> dst.
struct Channel {
  std::vector<Action> sends;         // in posting order
  std::vector<double> send_posts;    // post time of each send
  std::vector<Action> recvs;         // in posting order
  std::vector<double> recv_posts;    // post time of each receive
};

struct StageState {
  size_t pc = 0;       // next action to run
  double clock = 0;    // time the stage is free
  // The batch of communication actions at pc, once posted: [pc, batch_end).
  bool batch_posted = false;
  size_t batch_end = 0;
  double batch_post_time = 0;
  std::vector<int> batch_seq;  // per op: its index on its channel
  // Readiness times indexed [micro_batch * v + chunk]; kNotYet when not available.
  // bwd_done: the input grad of (m, c) exists (Backward or BackwardInput ended);
  // wgt_done: its weight grads (Backward or BackwardWeight ended).
  std::vector<double> fwd_done, bwd_done, wgt_done, act_ready, grad_ready;
  std::vector<char> split;  // (m, c) ran BackwardInput (so it needs a BackwardWeight)
  int in_flight = 0;
  // A list without backwards (BuildForwardOnlySchedule) keeps no activation
  // past its forward.
  bool forward_only = false;
};

class Simulator {
 public:
  Simulator(const Schedule& schedule, const SimOptions& options)
      : s_(schedule), opt_(schedule.options), sim_(options), p_(opt_.pp), v_(opt_.vp) {}

  absl::StatusOr<SimResult> Run();

 private:
  int Index(const Action& a) const { return a.micro_batch * v_ + a.chunk; }
  int Virtual(int r, int chunk) const { return VirtualStageOf(opt_, r, chunk); }
  int StageOf(int vs) const { return PlacementOf(opt_, vs).pp_rank; }
  int ChunkOf(int vs) const { return PlacementOf(opt_, vs).chunk; }
  // The channel an action travels on: (src, dst), and the tensor kind when tagged.
  int ChanIndex(int src, int dst, ActionKind k) const {
    const bool grad = k == ActionKind::kSendGrad || k == ActionKind::kRecvGrad;
    return (src * p_ + dst) * 2 + (sim_.tagged_channels && grad ? 1 : 0);
  }
  Channel& Chan(int src, int dst, ActionKind k) { return channels_[ChanIndex(src, dst, k)]; }
  const Channel& Chan(int src, int dst, ActionKind k) const {
    return channels_[ChanIndex(src, dst, k)];
  }
  double Cost(int r, const Action& a) const;

  absl::Status CheckWellFormed(int r, size_t i, const Action& a) const;
  absl::StatusOr<bool> Step(int r);  // true when stage r advanced
  absl::Status RunCompute(int r, const Action& a);
  absl::Status PostBatch(int r);
  absl::StatusOr<bool> TryCompleteBatch(int r);
  std::string Where(int r) const;
  std::string DescribeWait(int r) const;
  absl::Status Finish(SimResult* result);

  const Schedule& s_;
  const ScheduleOptions& opt_;
  const SimOptions& sim_;
  const int p_, v_;
  std::vector<StageState> st_;
  std::vector<Channel> channels_;
  SimResult result_;
};

double Simulator::Cost(int r, const Action& a) const {
  if (sim_.cost) return sim_.cost(r, a);
  switch (a.kind) {
    case ActionKind::kForward: return sim_.forward_cost;
    case ActionKind::kBackward: return sim_.backward_cost;
    case ActionKind::kBackwardInput: return sim_.backward_input_cost;
    case ActionKind::kBackwardWeight: return sim_.backward_weight_cost;
    default: return sim_.comm_cost;
  }
}

std::string Simulator::Where(int r) const {
  const auto& list = s_.stages[r];
  const size_t pc = st_[r].pc;
  if (pc >= list.size()) return "finished";
  return absl::StrFormat("at action #%d %s", pc, ToString(list[pc]));
}

absl::Status Simulator::CheckWellFormed(int r, size_t i, const Action& a) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stage %d action #%d %s: %s", r, i, ToString(a), why));
  };
  if (a.micro_batch < 0 || a.micro_batch >= opt_.micro_batches) {
    return bad(absl::StrFormat("micro-batch outside [0, M=%d)", opt_.micro_batches));
  }
  if (a.chunk < 0 || a.chunk >= v_) return bad(absl::StrFormat("chunk outside [0, v=%d)", v_));
  if (IsCompute(a.kind)) return absl::OkStatus();
  const int vs = Virtual(r, a.chunk);
  const bool toward_next =
      a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGrad;
  const int other = toward_next ? vs + 1 : vs - 1;
  if (other < 0 || other >= p_ * v_) {
    return bad(absl::StrFormat("virtual stage %d has no %s neighbour", vs,
                               toward_next ? "next" : "previous"));
  }
  if (StageOf(other) != a.peer || a.peer == r) {
    return bad(absl::StrFormat("the %s virtual stage %d lives on stage %d, not on stage %d",
                               toward_next ? "next" : "previous", other, StageOf(other), a.peer));
  }
  return absl::OkStatus();
}

absl::Status Simulator::RunCompute(int r, const Action& a) {
  StageState& st = st_[r];
  const int idx = Index(a);
  const int vs = Virtual(r, a.chunk);
  double ready = st.clock;
  auto missing = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "deadlock: stage %d cannot make progress at action #%d %s: it needs %s, which no "
        "earlier action on stage %d provides (hint: the actions are in an order that can "
        "never run)",
        r, st.pc, ToString(a), what, r));
  };
  if (a.kind == ActionKind::kForward) {
    if (st.fwd_done[idx] != kNotYet) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stage %d action #%d: %s runs twice", r, st.pc, ToString(a)));
    }
    if (vs > 0) {
      const int prev = vs - 1;
      double t = StageOf(prev) == r ? st.fwd_done[a.micro_batch * v_ + ChunkOf(prev)]
                                    : st.act_ready[idx];
      if (t == kNotYet) {
        return missing(absl::StrFormat("the activation of micro-batch %d from virtual stage %d",
                                       a.micro_batch, prev));
      }
      ready = std::max(ready, t);
    }
  } else if (a.kind == ActionKind::kBackwardWeight) {
    if (st.wgt_done[idx] != kNotYet) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stage %d action #%d: %s runs twice (or after a full Backward)", r, st.pc,
          ToString(a)));
    }
    if (!st.split[idx]) {
      return missing(absl::StrFormat("its own BackwardInput(micro-batch %d, chunk %d)",
                                     a.micro_batch, a.chunk));
    }
    ready = std::max(ready, st.bwd_done[idx]);
  } else {  // Backward or BackwardInput
    if (st.bwd_done[idx] != kNotYet) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stage %d action #%d: %s runs twice (a micro-batch's chunk runs Backward or "
          "BackwardInput once)",
          r, st.pc, ToString(a)));
    }
    if (st.fwd_done[idx] == kNotYet) {
      return missing(absl::StrFormat("its own Forward(micro-batch %d, chunk %d)", a.micro_batch,
                                     a.chunk));
    }
    ready = std::max(ready, st.fwd_done[idx]);
    if (vs + 1 < p_ * v_) {
      const int next = vs + 1;
      double t = StageOf(next) == r ? st.bwd_done[a.micro_batch * v_ + ChunkOf(next)]
                                    : st.grad_ready[idx];
      if (t == kNotYet) {
        return missing(absl::StrFormat("the output grad of micro-batch %d from virtual stage %d",
                                       a.micro_batch, next));
      }
      ready = std::max(ready, t);
    }
  }
  const double cost = Cost(r, a);
  const double end = ready + cost;
  if (a.kind == ActionKind::kForward) {
    st.fwd_done[idx] = end;
    st.in_flight++;
  } else if (a.kind == ActionKind::kBackward) {
    st.bwd_done[idx] = end;
    st.wgt_done[idx] = end;
    st.in_flight--;
  } else if (a.kind == ActionKind::kBackwardInput) {
    st.bwd_done[idx] = end;  // the activations stay until BackwardWeight
    st.split[idx] = 1;
  } else {
    st.wgt_done[idx] = end;
    st.in_flight--;
  }
  StageTimeline& tl = result_.stages[r];
  tl.peak_activations = std::max(tl.peak_activations, st.in_flight);
  if (a.kind == ActionKind::kForward && st.forward_only) st.in_flight--;
  tl.busy += cost;
  tl.actions.push_back({a, ready, end});
  st.clock = end;
  st.pc++;
  return absl::OkStatus();
}

absl::Status Simulator::PostBatch(int r) {
  StageState& st = st_[r];
  const auto& list = s_.stages[r];
  size_t end = st.pc;
  while (end < list.size() && !IsCompute(list[end].kind)) ++end;
  st.batch_end = end;
  st.batch_post_time = st.clock;
  st.batch_seq.clear();
  for (size_t i = st.pc; i < end; ++i) {
    const Action& a = list[i];
    if (IsSend(a.kind)) {
      const int idx = Index(a);
      const bool act = a.kind == ActionKind::kSendActivation;
      if ((act ? st.fwd_done[idx] : st.bwd_done[idx]) == kNotYet) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "deadlock: stage %d cannot make progress at action #%d %s: its %s(micro-batch %d, "
            "chunk %d) has not run before it (hint: send after the compute that produces it)",
            r, i, ToString(a), act ? "Forward" : "Backward (or BackwardInput)", a.micro_batch,
            a.chunk));
      }
      Channel& ch = Chan(r, a.peer, a.kind);
      st.batch_seq.push_back(static_cast<int>(ch.sends.size()));
      ch.sends.push_back(a);
      ch.send_posts.push_back(st.clock);
    } else {
      Channel& ch = Chan(a.peer, r, a.kind);
      st.batch_seq.push_back(static_cast<int>(ch.recvs.size()));
      ch.recvs.push_back(a);
      ch.recv_posts.push_back(st.clock);
    }
  }
  st.batch_posted = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> Simulator::TryCompleteBatch(int r) {
  StageState& st = st_[r];
  const auto& list = s_.stages[r];
  const bool eager = sim_.comm_mode == CommMode::kEager;
  std::vector<double> ends;
  for (size_t i = st.pc; i < st.batch_end; ++i) {
    const Action& a = list[i];
    const int k = st.batch_seq[i - st.pc];
    if (IsSend(a.kind)) {
      const Channel& ch = Chan(r, a.peer, a.kind);
      if (eager) {
        ends.push_back(st.batch_post_time);
      } else {
        if (k >= static_cast<int>(ch.recv_posts.size())) return false;
        ends.push_back(std::max(ch.send_posts[k], ch.recv_posts[k]) + Cost(r, a));
      }
      continue;
    }
    const Channel& ch = Chan(a.peer, r, a.kind);
    if (k >= static_cast<int>(ch.sends.size())) return false;
    const Action& sent = ch.sends[k];
    const bool kind_ok = (a.kind == ActionKind::kRecvActivation)
                             ? sent.kind == ActionKind::kSendActivation
                             : sent.kind == ActionKind::kSendGrad;
    const int want_vs = Virtual(r, a.chunk) + (a.kind == ActionKind::kRecvActivation ? -1 : 1);
    if (!kind_ok || sent.micro_batch != a.micro_batch || Virtual(a.peer, sent.chunk) != want_vs) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stage %d action #%d %s is message #%d on channel %d->%d, but stage %d sent %s "
          "there (hint: sends and receives on one channel must be in the same order)",
          r, i, ToString(a), k, a.peer, r, a.peer, ToString(sent)));
    }
    const double c = Cost(a.peer, sent);
    ends.push_back(eager ? std::max(ch.recv_posts[k], ch.send_posts[k] + c)
                         : std::max(ch.recv_posts[k], ch.send_posts[k]) + c);
  }
  // Every operation is matched: the batch completes.
  double done = st.batch_post_time;
  for (size_t i = st.pc; i < st.batch_end; ++i) {
    const Action& a = list[i];
    const double end = ends[i - st.pc];
    done = std::max(done, end);
    if (a.kind == ActionKind::kRecvActivation) st.act_ready[Index(a)] = end;
    if (a.kind == ActionKind::kRecvGrad) st.grad_ready[Index(a)] = end;
    result_.stages[r].actions.push_back({a, st.batch_post_time, end});
  }
  st.clock = done;
  st.pc = st.batch_end;
  st.batch_posted = false;
  return true;
}

absl::StatusOr<bool> Simulator::Step(int r) {
  StageState& st = st_[r];
  const auto& list = s_.stages[r];
  bool advanced = false;
  while (st.pc < list.size()) {
    const Action& a = list[st.pc];
    if (IsCompute(a.kind)) {
      if (absl::Status s = RunCompute(r, a); !s.ok()) return s;
      advanced = true;
      continue;
    }
    if (!st.batch_posted) {
      if (absl::Status s = PostBatch(r); !s.ok()) return s;
      advanced = true;
    }
    absl::StatusOr<bool> done = TryCompleteBatch(r);
    if (!done.ok()) return done.status();
    if (!*done) break;  // waiting on a peer
    advanced = true;
  }
  return advanced;
}

std::string Simulator::DescribeWait(int r) const {
  const StageState& st = st_[r];
  const auto& list = s_.stages[r];
  for (size_t i = st.pc; i < st.batch_end; ++i) {
    const Action& a = list[i];
    const int k = st.batch_seq[i - st.pc];
    if (IsRecv(a.kind)) {
      const Channel& ch = Chan(a.peer, r, a.kind);
      if (k < static_cast<int>(ch.sends.size())) continue;
      return absl::StrFormat(
          "stage %d is blocked at action #%d %s: it is message #%d on channel %d->%d, but "
          "stage %d has sent only %d message(s) to stage %d and is %s",
          r, i, ToString(a), k, a.peer, r, a.peer, ch.sends.size(), r, Where(a.peer));
    }
    if (sim_.comm_mode == CommMode::kRendezvous) {
      const Channel& ch = Chan(r, a.peer, a.kind);
      if (k < static_cast<int>(ch.recv_posts.size())) continue;
      return absl::StrFormat(
          "stage %d is blocked at action #%d %s: it is message #%d on channel %d->%d, but "
          "stage %d has posted only %d receive(s) from stage %d and is %s",
          r, i, ToString(a), k, r, a.peer, a.peer, ch.recv_posts.size(), r, Where(a.peer));
    }
  }
  return absl::StrFormat("stage %d is stuck %s", r, Where(r));
}

absl::Status Simulator::Finish(SimResult* result) {
  for (int src = 0; src < p_; ++src) {
    for (int dst = 0; dst < p_; ++dst) {
     for (int tag = 0; tag < 2; ++tag) {
      const Channel& ch = channels_[(src * p_ + dst) * 2 + tag];
      if (ch.sends.size() != ch.recvs.size()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "stage %d sent %d message(s) to stage %d, but stage %d received %d; first "
            "unmatched: %s",
            src, ch.sends.size(), dst, dst, ch.recvs.size(),
            ch.sends.size() > ch.recvs.size() ? ToString(ch.sends[ch.recvs.size()])
                                              : ToString(ch.recvs[ch.sends.size()])));
      }
     }
    }
  }
  for (int r = 0; r < p_; ++r) {
    if (st_[r].in_flight != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "stage %d finished with %d activation(s) whose Backward (or BackwardWeight) never ran",
          r,
          st_[r].in_flight));
    }
  }
  for (int r = 0; r < p_; ++r) {
    StageTimeline& tl = result_.stages[r];
    tl.finish = st_[r].clock;
    result_.makespan = std::max(result_.makespan, tl.finish);
    result_.ideal = std::max(result_.ideal, tl.busy);
  }
  result_.bubble_fraction =
      result_.ideal > 0 ? (result_.makespan - result_.ideal) / result_.ideal : 0.0;
  *result = std::move(result_);
  return absl::OkStatus();
}

absl::StatusOr<SimResult> Simulator::Run() {
  if (absl::Status s = ValidateScheduleOptions(opt_); !s.ok()) return s;
  if (static_cast<int>(s_.stages.size()) != p_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the schedule has %d stage lists for --pipeline-model-parallel-size=%d",
        s_.stages.size(), p_));
  }
  const size_t slots = static_cast<size_t>(opt_.micro_batches) * v_;
  st_.assign(p_, StageState{});
  for (int r = 0; r < p_; ++r) {
    StageState& st = st_[r];
    st.forward_only = std::none_of(s_.stages[r].begin(), s_.stages[r].end(),
                                   [](const Action& a) { return IsBackward(a.kind); });
    st.fwd_done.assign(slots, kNotYet);
    st.bwd_done.assign(slots, kNotYet);
    st.wgt_done.assign(slots, kNotYet);
    st.split.assign(slots, 0);
    st.act_ready.assign(slots, kNotYet);
    st.grad_ready.assign(slots, kNotYet);
  }
  channels_.assign(static_cast<size_t>(p_) * p_ * 2, Channel{});
  result_ = SimResult{};
  result_.stages.resize(p_);
  for (int r = 0; r < p_; ++r) {
    for (size_t i = 0; i < s_.stages[r].size(); ++i) {
      if (absl::Status s = CheckWellFormed(r, i, s_.stages[r][i]); !s.ok()) return s;
    }
  }
  // Dataflow timing: every action's times depend only on its predecessors', so sweeping the
  // stages until none advances gives the same times as an event queue.
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p_; ++r) {
      absl::StatusOr<bool> advanced = Step(r);
      if (!advanced.ok()) return advanced.status();
      progress = progress || *advanced;
    }
  }
  std::vector<std::string> stuck;
  for (int r = 0; r < p_; ++r) {
    if (st_[r].pc < s_.stages[r].size()) stuck.push_back(DescribeWait(r));
  }
  if (!stuck.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "deadlock: ", stuck.size(), " of ", p_, " stage(s) can never finish; ",
        absl::StrJoin(stuck, "; ")));
  }
  SimResult out;
  if (absl::Status s = Finish(&out); !s.ok()) return s;
  return out;
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const Schedule& schedule, const SimOptions& options) {
  return Simulator(schedule, options).Run();
}

}  // namespace loom::pipeline
