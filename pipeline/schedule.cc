#include "pipeline/schedule.h"

#include <algorithm>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace loom::pipeline {

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (std::optional<ScheduleKind> kind = core::FindEnum<ScheduleKind>(lower)) return *kind;
  if (lower == "zb-v" || lower == "zbvzerobubble") return ScheduleKind::kZBV;
  if (lower == "dualpipe-v" || lower == "scheduledualpipev") return ScheduleKind::kDualPipeV;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--pipeline-schedule='%s' is not a schedule; expected one of %s", std::string(name),
      core::EnumChoices<ScheduleKind>()));
}

const char* ScheduleKindName(ScheduleKind kind) { return core::EnumName(kind).data(); }

bool SplitsBackward(ScheduleKind kind) {
  return kind == ScheduleKind::kZBH1 || IsVShape(kind);
}

bool IsVShape(ScheduleKind kind) {
  return kind == ScheduleKind::kZBV || kind == ScheduleKind::kDualPipeV;
}

int VirtualStageOf(const ScheduleOptions& o, int r, int c) {
  if (IsVShape(o.kind)) return c == 0 ? r : 2 * o.pp - 1 - r;
  return c * o.pp + r;
}

StageChunk PlacementOf(const ScheduleOptions& o, int vs) {
  if (IsVShape(o.kind)) {
    return vs < o.pp ? StageChunk{vs, 0} : StageChunk{2 * o.pp - 1 - vs, 1};
  }
  return StageChunk{vs % o.pp, vs / o.pp};
}

bool NeedsBufferedSends(const ScheduleOptions& o) {
  return IsVShape(o.kind) || (o.kind == ScheduleKind::kInterleaved && EffectiveGroupSize(o) > o.pp);
}

int EffectiveGroupSize(const ScheduleOptions& o) {
  if (o.kind != ScheduleKind::kInterleaved) return 1;
  return o.microbatch_group_size > 0 ? o.microbatch_group_size : o.pp;
}

absl::Status ValidateScheduleOptions(const ScheduleOptions& o) {
  if (o.pp < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--pipeline-model-parallel-size (--pp) = %d: expected at least 1", o.pp));
  }
  if (o.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--micro-batches = %d: expected at least 1 micro-batch per step", o.micro_batches));
  }
  if (o.vp < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--virtual-pipeline-model-parallel-size (--vpp) = %d: expected at least 1", o.vp));
  }
  if (IsVShape(o.kind)) {
    const char* name = ScheduleKindName(o.kind);
    if (o.vp != 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--pipeline-schedule=%s runs two chunks per stage in a V and needs "
          "--virtual-pipeline-model-parallel-size (--vpp) = 2, got %d",
          name, o.vp));
    }
    if (o.microbatch_group_size != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--microbatch-group-size-per-virtual-pipeline-stage = %d applies only to "
          "--pipeline-schedule=interleaved, not %s",
          o.microbatch_group_size, name));
    }
    if (o.kind == ScheduleKind::kDualPipeV && o.micro_batches < 2 * o.pp) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--pipeline-schedule=dualpipev needs at least as many micro-batches as virtual "
          "stages, 2 x --pipeline-model-parallel-size = %d; --micro-batches = %d "
          "(torch's ScheduleDualPipeV requires the same)",
          2 * o.pp, o.micro_batches));
    }
    return absl::OkStatus();
  }
  if (o.kind != ScheduleKind::kInterleaved) {
    if (o.vp != 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--virtual-pipeline-model-parallel-size (--vpp) = %d needs "
          "--pipeline-schedule=interleaved; --pipeline-schedule=%s runs one chunk per stage "
          "(hint: drop --vpp or use the interleaved or zbv schedule)",
          o.vp, ScheduleKindName(o.kind)));
    }
    if (o.microbatch_group_size != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--microbatch-group-size-per-virtual-pipeline-stage = %d applies only to "
          "--pipeline-schedule=interleaved, not %s",
          o.microbatch_group_size, ScheduleKindName(o.kind)));
    }
    return absl::OkStatus();
  }
  // Interleaved.
  if (o.pp < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--pipeline-schedule=interleaved needs --pipeline-model-parallel-size (--pp) >= 2, "
        "got %d (hint: with one stage there is nothing to interleave; use 1f1b)",
        o.pp));
  }
  if (o.vp < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--pipeline-schedule=interleaved needs --virtual-pipeline-model-parallel-size (--vpp) "
        ">= 2 chunks per stage, got %d (hint: use 1f1b for one chunk)",
        o.vp));
  }
  if (o.microbatch_group_size < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--microbatch-group-size-per-virtual-pipeline-stage = %d: expected 0 (default: "
        "--pipeline-model-parallel-size) or a value in [P, M]",
        o.microbatch_group_size));
  }
  const int g = EffectiveGroupSize(o);
  if (g < o.pp || g > o.micro_batches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--microbatch-group-size-per-virtual-pipeline-stage = %d%s must lie in "
        "[--pipeline-model-parallel-size, --micro-batches] = [%d, %d] for the interleaved "
        "schedule (hint: use at least --micro-batches=%d)",
        g, o.microbatch_group_size == 0 ? " (default: --pipeline-model-parallel-size)" : "",
        o.pp, o.micro_batches, std::max(g, o.pp)));
  }
  if (o.micro_batches % g != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--micro-batches = %d must be a multiple of "
        "--microbatch-group-size-per-virtual-pipeline-stage = %d%s for the interleaved "
        "schedule, as Megatron requires (hint: --micro-batches=%d or %d)",
        o.micro_batches, g,
        o.microbatch_group_size == 0 ? " (default: --pipeline-model-parallel-size)" : "",
        (o.micro_batches / g) * g, (o.micro_batches / g + 1) * g));
  }
  return absl::OkStatus();
}

int WarmupForwards(const ScheduleOptions& o, int r) {
  const int total = o.micro_batches * o.vp;
  switch (o.kind) {
    case ScheduleKind::kGPipe:
      return o.micro_batches;
    case ScheduleKind::k1F1B:
      return std::min(o.pp - r - 1, o.micro_batches);
    case ScheduleKind::kInterleaved:
      return std::min(2 * (o.pp - r - 1) + (o.vp - 1) * EffectiveGroupSize(o), total);
    case ScheduleKind::kZBH1:
      return std::min(o.pp - r - 1, o.micro_batches);
    case ScheduleKind::kZBV:
    case ScheduleKind::kDualPipeV: {
      int forwards = 0;
      for (const Action& a : ComputeOrder(o, r)) {
        if (a.kind != ActionKind::kForward) break;
        ++forwards;
      }
      return std::max(0, forwards - 1);
    }
  }
  return 0;
}

int PeakInFlightActivations(const ScheduleOptions& o, int r) {
  int live = 0, peak = 0;
  for (const Action& a : ComputeOrder(o, r)) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --live;
  }
  return peak;
}

ChunkStep NthStep(const ScheduleOptions& o, int k, bool forward) {
  const int g = std::max(1, EffectiveGroupSize(o));
  const int v = o.vp;
  ChunkStep s;
  s.chunk = (k / g) % v;
  if (!forward) s.chunk = v - 1 - s.chunk;
  s.micro_batch = (k / (g * v)) * g + k % g;
  return s;
}

namespace {

// ZB-H1 on stage r: 1F1B with I for B and W(m) right after I(m + r).
std::vector<Action> ZBH1Order(const ScheduleOptions& o, int r) {
  const int m = o.micro_batches;
  const int warmup = std::min(o.pp - r - 1, m);
  std::vector<Action> order;
  order.reserve(3 * m);
  int next_w = 0;
  auto backward = [&](int i) {
    order.push_back(BackwardInput(i, 0));
    if (i - r >= 0) order.push_back(BackwardWeight(next_w++, 0));
  };
  for (int k = 0; k < warmup; ++k) order.push_back(Forward(k, 0));
  for (int i = 0; i < m - warmup; ++i) {
    order.push_back(Forward(warmup + i, 0));
    backward(i);
  }
  for (int i = m - warmup; i < m; ++i) backward(i);
  while (next_w < m) order.push_back(BackwardWeight(next_w++, 0));
  return order;
}

// ZB-V on stage r: torch's ScheduleZBVZeroBubble order for n = max(M, 2P − 1) micro-batches,
// then only micro-batches < M.
std::vector<Action> ZBVOrder(const ScheduleOptions& o, int r) {
  const int p = o.pp;
  const int n = std::max(o.micro_batches, 2 * p - 1);
  std::vector<Action> order;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  for (int i = 0; i < 2 * (p - r) - 1; ++i) order.push_back(Forward(f0++, 0));
  for (int i = 0; i < r; ++i) {
    order.push_back(Forward(f1++, 1));
    order.push_back(Forward(f0++, 0));
  }
  for (int i = 0; i < p - r; ++i) {
    order.push_back(Forward(f1++, 1));
    order.push_back(BackwardInput(b1, 1));
    order.push_back(BackwardWeight(b1++, 1));
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) order.push_back(Forward(f0++, 0));
    order.push_back(BackwardInput(b0, 0));
    order.push_back(BackwardWeight(b0++, 0));
    order.push_back(Forward(f1++, 1));
    order.push_back(BackwardInput(b1, 1));
    order.push_back(BackwardWeight(b1++, 1));
  }
  int w0 = b0, w1 = b1;
  for (int i = 0; i < r; ++i) {
    order.push_back(BackwardInput(b0++, 0));
    order.push_back(BackwardInput(b1++, 1));
  }
  for (int i = 0; i < p - r; ++i) {
    order.push_back(BackwardInput(b0++, 0));
    order.push_back(BackwardWeight(w0++, 0));
  }
  while (w1 < b1) order.push_back(BackwardWeight(w1++, 1));
  while (w0 < b0) order.push_back(BackwardWeight(w0++, 0));
  std::vector<Action> kept;
  kept.reserve(order.size());
  for (const Action& a : order) {
    if (a.micro_batch < o.micro_batches) kept.push_back(a);
  }
  return kept;
}

// DualPipeV on stage r: torch's ScheduleDualPipeV._calculate_single_rank_operations
// (torch/distributed/pipelining/schedules.py) action for action. Its OVERLAP_F_B compound
// action (a forward of one chunk with the full backward of the other, for different
// micro-batches) is the forward then the backward; each is a step of its own, so the forward's
// send goes out (non-blocking, over buffered links) before the backward runs and its transfer
// hides behind the backward's compute. Each chunk's micro-batches run in order for every action
// kind, so counters stand in for torch's.
std::vector<Action> DualPipeVOrder(const ScheduleOptions& o, int r) {
  const int p = o.pp, n = o.micro_batches;
  std::vector<Action> order;
  int f[2] = {0, 0}, b[2] = {0, 0};           // next micro-batch per chunk

  std::vector<std::pair<int, int>> pending_w;  // (chunk, micro-batch) of each I, oldest first
  auto forward = [&](int c) { return Forward(f[c]++, c); };
  auto full_backward = [&](int c) { return Backward(b[c]++, c); };
  auto input_backward = [&](int c) {
    pending_w.emplace_back(c, b[c]);
    return BackwardInput(b[c]++, c);
  };
  auto single = [&](Action a) { order.push_back(a); };
  auto overlap = [&](int forward_chunk, int backward_chunk) {  // torch runs the forward first
    single(forward(forward_chunk));
    single(full_backward(backward_chunk));
  };
  auto weight_if_pending = [&] {
    if (pending_w.empty()) return;
    const auto [c, m] = pending_w.front();
    pending_w.erase(pending_w.begin());
    single(BackwardWeight(m, c));
  };
  for (int i = 0; i < 2 * (p - r - 1); ++i) single(forward(0));  // 1: F0
  for (int i = 0; i < r + 1; ++i) {                              // 2: F0 F1
    single(forward(0));
    single(forward(1));
  }
  for (int i = 0; i < p - r - 1; ++i) {  // 3: I1 W1 F1 (zero bubble)
    single(input_backward(1));
    weight_if_pending();
    single(forward(1));
  }
  for (int i = 0; i < n - 2 * p + r + 1; ++i) {  // 4: F0&B1, F1&B0 (the main step)
    if (i == 0 && r == p - 1) {
      // The last stage does not overlap its first pair, to shrink the bubble (torch's note).
      single(forward(0));
      single(full_backward(1));
    } else {
      overlap(0, 1);
    }
    overlap(1, 0);
  }
  for (int i = 0; i < p - r - 1; ++i) {  // 5: B1, F1&B0
    single(full_backward(1));
    overlap(1, 0);
  }
  bool zero_bubble = false;  // 6: B1 B0, the second half with split backwards
  for (int i = 0; i < r + 1; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1) zero_bubble = true;
    single(zero_bubble ? input_backward(1) : full_backward(1));
    if (i == (r + 1) / 2 && r % 2 == 0) zero_bubble = true;
    single(zero_bubble ? input_backward(0) : full_backward(0));
  }
  for (int i = 0; i < p - r - 1; ++i) {  // 7: W0 B0
    weight_if_pending();
    single(zero_bubble ? input_backward(0) : full_backward(0));
  }
  for (int i = 0; i < r + 1; ++i) weight_if_pending();  // 8: W0
  return order;
}

}  // namespace

std::vector<Action> ComputeOrder(const ScheduleOptions& o, int r) {
  if (o.kind == ScheduleKind::kZBH1) return ZBH1Order(o, r);
  if (o.kind == ScheduleKind::kZBV) return ZBVOrder(o, r);
  if (o.kind == ScheduleKind::kDualPipeV) return DualPipeVOrder(o, r);
  const int total = o.micro_batches * o.vp;
  const int warmup = WarmupForwards(o, r);
  auto fwd = [&](int k) {
    ChunkStep s = NthStep(o, k, /*forward=*/true);
    return Forward(s.micro_batch, s.chunk);
  };
  auto bwd = [&](int k) {
    ChunkStep s = NthStep(o, k, /*forward=*/false);
    return Backward(s.micro_batch, s.chunk);
  };
  std::vector<Action> order;
  order.reserve(2 * total);
  for (int k = 0; k < warmup; ++k) order.push_back(fwd(k));            // warm-up
  for (int i = 0; i < total - warmup; ++i) {                            // steady 1F1B
    order.push_back(fwd(warmup + i));
    order.push_back(bwd(i));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(bwd(k));  // cool-down
  return order;
}

namespace {

// Where the tensors of one compute action come from and go to, on stage r.
struct Neighbours {
  int prev_stage = -1;  // stage of the previous virtual stage; -1: none or local
  int next_stage = -1;  // stage of the next virtual stage; -1: none or local
};

Neighbours NeighboursOf(const ScheduleOptions& o, int r, int chunk) {
  const int p = o.pp;
  const int vs = VirtualStageOf(o, r, chunk);
  Neighbours n;
  if (vs > 0 && PlacementOf(o, vs - 1).pp_rank != r) n.prev_stage = PlacementOf(o, vs - 1).pp_rank;
  if (vs < p * o.vp - 1 && PlacementOf(o, vs + 1).pp_rank != r) {
    n.next_stage = PlacementOf(o, vs + 1).pp_rank;
  }
  return n;
}

// Receives a step's compute actions need.
void AppendRecvs(const ScheduleOptions& o, int r, const std::vector<Action>& step,
                 std::vector<Action>* out) {
  for (const Action& a : step) {
    const Neighbours n = NeighboursOf(o, r, a.chunk);
    if (a.kind == ActionKind::kForward && n.prev_stage >= 0) {
      out->push_back({ActionKind::kRecvActivation, a.micro_batch, a.chunk, n.prev_stage});
    }
    if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) &&
        n.next_stage >= 0) {
      out->push_back({ActionKind::kRecvGrad, a.micro_batch, a.chunk, n.next_stage});
    }
  }
}

// Sends of what a step's compute actions produced.
void AppendSends(const ScheduleOptions& o, int r, const std::vector<Action>& step,
                 std::vector<Action>* out) {
  for (const Action& a : step) {
    const Neighbours n = NeighboursOf(o, r, a.chunk);
    if (a.kind == ActionKind::kForward && n.next_stage >= 0) {
      out->push_back({ActionKind::kSendActivation, a.micro_batch, a.chunk, n.next_stage});
    }
    if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) &&
        n.prev_stage >= 0) {
      out->push_back({ActionKind::kSendGrad, a.micro_batch, a.chunk, n.prev_stage});
    }
  }
}

// Splits a stage's compute order into steps; one batch of communication follows each step.
// GPipe and 1F1B: every compute action is a step (Megatron's send_forward_recv_backward /
// send_backward_recv_forward pairing). Interleaved: the steady state's Forward + Backward pair
// is one step, followed by one four-way batch, as in Megatron's
// send_forward_backward_recv_forward_backward; this keeps the schedule deadlock-free when
// sends block until received.
std::vector<std::vector<Action>> Steps(const ScheduleOptions& o, int r,
                                       const std::vector<Action>& compute) {
  std::vector<std::vector<Action>> steps;
  const int total = o.micro_batches * o.vp;
  const int warmup = WarmupForwards(o, r);
  const bool pair_steady = o.kind == ScheduleKind::kInterleaved;
  size_t i = 0;
  while (i < compute.size()) {
    const bool steady = i >= static_cast<size_t>(warmup) &&
                        i < static_cast<size_t>(warmup + 2 * (total - warmup));
    const size_t n = pair_steady && steady ? 2 : 1;
    steps.emplace_back(compute.begin() + i, compute.begin() + i + n);
    i += n;
  }
  return steps;
}

// Inserts the communication implied by stage r's compute order: the receives of the first step
// up front, then after every step one batch with its sends and the next step's receives.
std::vector<Action> WithCommunication(const ScheduleOptions& o, int r,
                                      const std::vector<Action>& compute) {
  const std::vector<std::vector<Action>> steps = Steps(o, r, compute);
  std::vector<Action> out;
  out.reserve(compute.size() * 3);
  if (!steps.empty()) AppendRecvs(o, r, steps[0], &out);
  for (size_t s = 0; s < steps.size(); ++s) {
    out.insert(out.end(), steps[s].begin(), steps[s].end());
    AppendSends(o, r, steps[s], &out);
    if (s + 1 < steps.size()) AppendRecvs(o, r, steps[s + 1], &out);
  }
  return out;
}

// Stage r's forward-only list. Its k-th forward is NthStep(k); the batch after forward k
// (k = -1: before the first) gets the number T = k + r. A send goes into the batch right after
// its forward; the receive of forward k into the batch with the T of the send that feeds it,
// i.e. after the sender's forward index k_src on stage s: batch k_src + s - r. That is k - 1,
// except on the wrap-around link into stage 0 (k_src = k - G, s = P - 1): k - 1 - (G - P).
std::vector<Action> ForwardOnlyList(const ScheduleOptions& o, int r) {
  const int total = o.micro_batches * o.vp;
  const int p = o.pp;
  // Forward index of (micro-batch, chunk), the same on every stage.
  std::vector<int> index(total);
  for (int k = 0; k < total; ++k) {
    const ChunkStep s = NthStep(o, k, /*forward=*/true);
    index[s.micro_batch * o.vp + s.chunk] = k;
  }
  // sends[k + 1], recvs[k + 1]: the batch after forward k (sends first, as in BuildSchedule).
  std::vector<std::vector<Action>> sends(total + 1), recvs(total + 1);
  for (int k = 0; k < total; ++k) {
    const ChunkStep s = NthStep(o, k, /*forward=*/true);
    const Neighbours n = NeighboursOf(o, r, s.chunk);
    if (n.next_stage >= 0) {
      sends[k + 1].push_back({ActionKind::kSendActivation, s.micro_batch, s.chunk, n.next_stage});
    }
    if (n.prev_stage >= 0) {
      const int prev_vs = s.chunk * p + r - 1;
      const int k_src = index[s.micro_batch * o.vp + prev_vs / p];
      // In [-1, k - 1] for every valid G >= P; clamp anyway so a forward never precedes its input.
      const int batch = std::max(-1, std::min(k - 1, k_src + n.prev_stage - r));
      recvs[batch + 1].push_back(
          {ActionKind::kRecvActivation, s.micro_batch, s.chunk, n.prev_stage});
    }
  }
  std::vector<Action> out;
  out.reserve(3 * total);
  for (int k = -1; k < total; ++k) {
    if (k >= 0) {
      const ChunkStep s = NthStep(o, k, /*forward=*/true);
      out.push_back(Forward(s.micro_batch, s.chunk));
    }
    out.insert(out.end(), sends[k + 1].begin(), sends[k + 1].end());
    out.insert(out.end(), recvs[k + 1].begin(), recvs[k + 1].end());
  }
  return out;
}

// The V's forward-only list on stage r: chunk 0's M forwards, then chunk 1's, each with its
// receive right before it and its send right after. Every stage runs chunk 0 before chunk 1 and
// chunk 1 of stage r waits only on stages > r (the turn of the V on stage P − 1 is local), so
// with buffered sends and tagged channels (what the V needs anyway) nothing waits in a cycle.
std::vector<Action> VForwardOnlyList(const ScheduleOptions& o, int r) {
  std::vector<Action> out;
  for (int c = 0; c < 2; ++c) {
    const Neighbours n = NeighboursOf(o, r, c);
    for (int m = 0; m < o.micro_batches; ++m) {
      if (n.prev_stage >= 0) out.push_back({ActionKind::kRecvActivation, m, c, n.prev_stage});
      out.push_back(Forward(m, c));
      if (n.next_stage >= 0) out.push_back({ActionKind::kSendActivation, m, c, n.next_stage});
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Schedule> BuildForwardOnlySchedule(const ScheduleOptions& options) {
  if (absl::Status s = ValidateScheduleOptions(options); !s.ok()) return s;
  Schedule schedule;
  schedule.options = options;
  schedule.stages.resize(options.pp);
  for (int r = 0; r < options.pp; ++r) {
    schedule.stages[r] =
        IsVShape(options.kind) ? VForwardOnlyList(options, r) : ForwardOnlyList(options, r);
  }
  return schedule;
}

absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& options) {
  if (absl::Status s = ValidateScheduleOptions(options); !s.ok()) return s;
  Schedule schedule;
  schedule.options = options;
  schedule.stages.resize(options.pp);
  for (int r = 0; r < options.pp; ++r) {
    schedule.stages[r] = WithCommunication(options, r, ComputeOrder(options, r));
  }
  return schedule;
}

}  // namespace loom::pipeline
