#ifndef LOOM_PIPELINE_SIMULATOR_H_
#define LOOM_PIPELINE_SIMULATOR_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/action.h"
#include "pipeline/schedule.h"

namespace loom::pipeline {

// A discrete-event simulator for pipeline schedules: runs every stage's action list, in order,
// with per-action costs, and reports when each action ran.
//
// Model
// - A stage runs its list strictly in order; compute actions take their cost.
// - Forward(m, c) needs its input activation: received by an earlier RecvActivation(m, c) on
//   this stage, or produced locally by Forward(m, c') when the previous virtual stage is on this
//   stage (P = 1); virtual stage 0 needs nothing. Backward(m, c) needs this stage's own
//   Forward(m, c) and, unless it is the last virtual stage, the output grad (RecvGrad(m, c) or
//   local). SendActivation(m, c) needs Forward(m, c) done; SendGrad(m, c) needs Backward(m, c).
//   Split backward: BackwardInput(m, c) needs what Backward needs and stands in for it (SendGrad
//   and the previous virtual stage's backward wait for it); BackwardWeight(m, c) needs this
//   stage's BackwardInput(m, c) earlier in its list. Running Backward and BackwardInput of one
//   (m, c), or BackwardWeight twice, is an error; so is a BackwardInput whose BackwardWeight
//   never runs (its activation stays in flight).
//   A compute action whose input no earlier action provides is an ordering error.
// - A maximal run of consecutive communication actions is one batch (batched isend/irecv): all
//   its operations are posted together when the stage reaches it, and the stage continues when
//   all of them completed. The k-th send on a channel matches the k-th receive on it; the
//   simulator checks that they carry the same micro-batch and adjacent virtual stages. A channel
//   is (src, dst, tensor kind) when tagged_channels (activations and grads told apart, like MPI
//   tags), else (src, dst) alone (NCCL-like, one FIFO per pair).
//   kEager: a send completes when posted (buffered); a receive completes at
//           max(its post, send post + comm_cost).
//   kRendezvous: both complete at max(send post, recv post) + comm_cost (NCCL-like), which
//           also catches orders that only deadlock when sends block.
// - Deadlock: when no stage can progress and some have not finished, the error
//   (absl::FailedPreconditionError, message starting "deadlock:") lists every stuck stage, the
//   action it waits on and what that action is waiting for.
//
// Bubble fraction (Megatron's definition, t_bubble / t_ideal):
//   ideal  = the largest per-stage busy time (sum of its compute costs);
//   bubble = (makespan − ideal) / ideal.
// With uniform costs f, b per chunk and zero comm cost the ideal is M·v·(f + b); GPipe and
// 1F1B give (P − 1)/M and interleaved 1F1B gives (P − 1)/(v·M).
// Zero-bubble schedules with f = b_input = b_weight and backward_cost = b_input + b_weight (the
// same work): zb-h1 gives (P − 1)(f + b_input − b_weight) of bubble time (Qi et al., Table 1),
// (P − 1)/(3M) with equal costs; zbv only the pipeline fill (P − 1)·f of any schedule,
// (P − 1)/(6M), once M >= 2P − 1 (simulator_test's bubble table). zb-h1 is deadlock-free with
// rendezvous sends; zbv needs buffered sends and tagged channels.

enum class CommMode { kEager, kRendezvous };

struct SimOptions {
  double forward_cost = 1.0;   // per Forward(m, c) of one chunk (f)
  double backward_cost = 2.0;  // per Backward(m, c) of one chunk (b); b = 2f is typical
  // Split backward (zero-bubble schedules): BackwardInput (the paper's T_B) and BackwardWeight
  // (T_W). Qi et al. assume T_F = T_B = T_W; so do these defaults (with f = 1).
  double backward_input_cost = 1.0;
  double backward_weight_cost = 1.0;
  double comm_cost = 0.0;      // per point-to-point transfer
  CommMode comm_mode = CommMode::kEager;
  bool tagged_channels = true;  // activations and grads on separate channels per (src, dst)
  // When set, overrides the three costs above for every action (compute and communication).
  std::function<double(int pp_rank, const Action&)> cost;
};

struct TimedAction {
  Action action;
  double start = 0;  // compute: start; communication: time its batch was posted
  double end = 0;    // compute: start + cost; communication: time it completed
};

struct StageTimeline {
  std::vector<TimedAction> actions;  // in program order, communication included
  double busy = 0;                   // sum of compute costs
  double finish = 0;                 // end of the last action
  // Peak number of chunk activations held: Forward(m, c) done whose Backward(m, c) (or
  // BackwardWeight(m, c): W reads the saved inputs, so a split backward holds them until W) has
  // not run
  // (a forward-only list holds one: the forward that is running).
  int peak_activations = 0;
};

struct SimResult {
  std::vector<StageTimeline> stages;  // [P]
  double makespan = 0;                // max over stages of finish
  double ideal = 0;                   // max over stages of busy
  double bubble_fraction = 0;         // (makespan − ideal) / ideal
};

absl::StatusOr<SimResult> Simulate(const Schedule& schedule, const SimOptions& options = {});

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_SIMULATOR_H_
