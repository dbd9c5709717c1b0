#ifndef LOOM_PIPELINE_EXECUTOR_H_
#define LOOM_PIPELINE_EXECUTOR_H_

// Runs one training step of a pipeline schedule (//pipeline:schedule) on the
// model chunks one rank holds (any layers::StageModel: layers/stage_model.h):
// Megatron's forward_backward_func over schedules-as-data.
//
// Every pipeline stage (and every TP rank of it) constructs one Executor and
// calls RunStep once per step, in the same order as its peers. RunStep:
//   1. executes this stage's action list: Forward/Backward of its chunks, and
//      each run of consecutive communication actions as ONE BatchSendRecv
//      (//pipeline:p2p) that it waits for before going on;
//   2. keeps only the activations (StageModel::Activations) the schedule still needs:
//      a micro-batch's record is freed right after its backward;
//   3. accumulates gradients over micro-batches into the model's grad buffer
//      (the backward of micro-batch m starts from dloss = loss_scale); it does
//      NOT zero them first, and reduces nothing across ranks: the step
//      boundary and every gradient reduction (DP, the SP sum over TP, the tied
//      embedding over the first and last stage) are the caller's
//      (//distributed:gradient_sync, driven by the model's hooks);
//   4. broadcasts the mean loss from the last stage to every stage: a plain
//      Communicator::Broadcast on the pp communicator (root = the last pp
//      rank), which matches whatever point-to-point traffic each stage issued
//      before it (comm/comm.h, POINT TO POINT); no separate communicator.
//
// Split backward (zb-h1, zbv): BackwardInput and BackwardWeight run through
// StageModel::SplitsBackward() / BackwardInput / BackwardWeight, and a record
// lives until its BackwardWeight. A model that does not split (GptModel today)
// runs its full Backward at BackwardInput (and frees the record there) and
// nothing at BackwardWeight: the numbers of 1F1B, none of the bubble saving,
// which needs the model's split. zbv's V (schedule.h's VirtualStageOf): stage
// P − 1 hands chunk 0's output (and chunk 1's input grad) to its other chunk
// without communication, and the losses live on stage 0, which holds the last
// virtual stage; the loss broadcast's root is that stage. Both the embedding
// and the output layer live on stage 0, so the tied embedding needs no sum
// over the grid's embedding group (stages 0 and P − 1): pass none.
//
// A forward-only schedule (BuildForwardOnlySchedule, for evaluation) runs
// with ExecutorOptions::forward_only: no backward, each micro-batch's
// activations are dropped as soon as its forward has run.
//
// Errors never hang: every wait uses the communicator's CommOptions::timeout,
// and a failed batch names the stage and the actions, e.g.
//   "stage 1: RecvGrad(micro-batch 3, chunk 0) from stage 2: <comm status>".
//
// Interleaved schedules with microbatch_group_size G > P post their warm-up
// sends long before the peer receives them; RunStep waits for each batch,
// sends included, so this relies on sends that complete without a matching
// receive (the local backend copies eagerly; tested). G = P needs nothing.

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/stage_model.h"
#include "pipeline/p2p.h"
#include "pipeline/schedule.h"

namespace loom::pipeline {

// What the data pipeline gives for micro-batch m of this step.
struct MicroBatch {
  core::Tensor ids;      // i32[s, b]: read by the stage holding the first chunk
  core::Tensor targets;  // i32[s, b]: read by the stage holding the last chunk
  // Dropout of this micro-batch. The caller picks the stream (e.g. from the
  // iteration and the micro-batch's first global sample) so that every layout
  // draws the same masks.
  layers::DropoutStream dropout;
};
// Called at most once per micro-batch per step on each rank, when it is first needed.
using MicroBatchSource = std::function<absl::StatusOr<MicroBatch>(int micro_batch)>;

// Observes what RunStep runs (the trainer's timers and profiler:
// train/timers.h). Begin and End bracket each compute action (count 1) and
// each batch of communication actions (the batch, in list order), on the
// calling thread; End is skipped when the action fails.
class ActionObserver {
 public:
  virtual ~ActionObserver() = default;
  virtual void Begin(const Action* actions, int count) = 0;
  virtual void End(const Action* actions, int count) = 0;
};

struct ExecutorOptions {
  // b (--micro-batch-size): boundary tensors are the model's BoundaryShape(b)
  // (GPT: [s (/tp under SP), b, h]).
  int64_t micro_batch_size = 1;
  // dloss of every micro-batch's mean loss; pass 1/M for the mean over the step
  // (Megatron divides each micro-batch loss by the number of micro-batches).
  float loss_scale = 1.0f;
  // Broadcast the mean loss from the last stage to every stage (collective over pp).
  bool broadcast_loss = true;
  // The schedule has no backward (BuildForwardOnlySchedule): evaluation.
  bool forward_only = false;
  // Told of every action (null: nothing, one branch per action). Must
  // outlive the Executor.
  ActionObserver* observer = nullptr;
};

struct StepResult {
  // Mean loss of each micro-batch (unscaled), [M]; filled only on the rank
  // holding the post-process chunk (the last stage; stage 0 under zbv), empty elsewhere.
  std::vector<double> losses;
  // Mean of `losses`, on every stage (broadcast over pp); on other stages 0
  // when broadcast_loss is false.
  double mean_loss = 0;
  // Peak number of live StageModel::Activations records per chunk during the step
  // (GPipe: M; 1F1B: at most P on stage 0).
  std::vector<int> peak_live_saved;
  // Peak of the summed Activations::ActivationBytes() over all chunks.
  int64_t peak_activation_bytes = 0;
};

class Executor {
 public:
  // Checks that `model` fits `schedule` for this rank before any step runs:
  // the model has vp chunks; chunk c is pre_process iff it is virtual stage 0
  // and post_process iff it is the last virtual stage; `pp` has P ranks (may
  // be null when P = 1); every communication action's peer is an adjacent
  // stage; tags fit; the schedule has backward actions unless forward_only.
  // The pointers must outlive the Executor.
  static absl::StatusOr<Executor> Create(const Schedule& schedule, layers::StageModel* model,
                                         comm::Communicator* pp,
                                         const ExecutorOptions& options = {});

  // One training step (see the top of this file), or one evaluation pass of
  // the micro-batches with forward_only. Collective over pp (and TP).
  absl::StatusOr<StepResult> RunStep(const MicroBatchSource& source);

  int pp_rank() const { return pp_rank_; }
  const std::vector<Action>& actions() const { return schedule_.stages[pp_rank_]; }
  const core::Shape& boundary_shape() const { return p2p_.boundary_shape(); }
  bool is_first_stage() const { return pp_rank_ == 0; }
  bool is_last_stage() const { return pp_rank_ == schedule_.options.pp - 1; }

 private:
  Executor(const Schedule& schedule, layers::StageModel* model, comm::Communicator* pp,
           const ExecutorOptions& options, core::Shape boundary);

  Schedule schedule_;
  layers::StageModel* model_;
  comm::Communicator* pp_;
  ExecutorOptions options_;
  int pp_rank_ = 0;
  StageP2P p2p_;
};

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_EXECUTOR_H_
