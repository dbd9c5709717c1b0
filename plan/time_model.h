#ifndef LOOM_PLAN_TIME_MODEL_H_
#define LOOM_PLAN_TIME_MODEL_H_

// Step time of one layout on one hardware description (docs/PLANNER.md).
//
// Per chunk and micro-batch, on one rank (T = s/CP · b tokens, t = TP):
//   forward  f = Σ_GEMM 2mnk / (peak · eff(2mnk)) + attention + element-wise
//                + exposed TP (and CP, EP) communication
//   backward b = 2 × the GEMMs (dX and dW) + 2.5 × attention + 2 × element-wise
//                + exposed communication (Loom overlaps the backward's TP
//                reduction of dX with the dW GEMM: exposed = max(0, comm − dW))
//                + the forward again under full recomputation (the attention
//                core under selective)
// The pipeline: pipeline::Simulate runs the very schedule //train:gpt runs
// (BuildSchedule) with these per-action costs and the point-to-point
// transfer time, giving the makespan and bubble.
// Data parallelism: gradient all-reduce (or ZeRO-1's reduce-scatter +
// all-gather) of the stage's f32 gradients over DP·CP; with
// --overlap-grad-reduce (--overlap-param-gather) all but the last bucket hides
// behind the last micro-batch's backward (the first's forward).
// Optimizer: Adam is memory-bound, 32 bytes per owned element.
//   step = makespan + exposed DP + optimizer
//   MFU  = tokens/step · (6N + 12·L·h·s) / (step · GPUs · peak)

#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "plan/hardware.h"

namespace loom::plan {

struct TimeOptions {
  // Megatron's --tp-comm-overlap: the forward's TP communication hides
  // behind its GEMMs too (Loom overlaps only the backward's).
  bool tp_comm_overlap = false;
  // Bytes per element of the distributed optimizer's parameter all-gather:
  // 4, Loom's (it gathers the f32 master values and refreshes the bf16 copy
  // from them); 2, Megatron's (it gathers the bf16 model parameters).
  int param_gather_bytes = 4;
};

struct StepTime {
  double compute = 0;         // the busiest stage's compute + the optimizer
  double exposed_comm = 0;    // TP/CP/EP inside the actions, and DP after them
  double bubble = 0;          // pipeline fill/drain and waits (makespan − ideal)
  double step = 0;            // compute + exposed_comm + bubble
  double tokens_per_s = 0;
  double mfu = 0;
  double model_flops_per_step = 0;
  double bubble_fraction = 0;  // the simulator's
  std::vector<int> in_flight;  // peak chunk activations per stage (simulator)
  // For --explain.
  double forward_chunk = 0, backward_chunk = 0, p2p = 0, dp_comm = 0, dp_exposed = 0,
         optimizer = 0, tp_exposed_per_layer = 0, makespan = 0;
};

// Model FLOPs of one step (spec: 6N + 12·L·h·s per token, N active params).
double ModelFlopsPerStep(const train::TrainConfig& c);

absl::StatusOr<StepTime> PredictStepTime(const train::TrainConfig& c, const Hardware& hw,
                                         const TimeOptions& options = {});

std::string ExplainTime(const train::TrainConfig& c, const Hardware& hw, const StepTime& t);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TIME_MODEL_H_
