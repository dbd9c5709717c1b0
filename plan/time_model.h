#ifndef LOOM_PLAN_TIME_MODEL_H_
#define LOOM_PLAN_TIME_MODEL_H_

// Step time of one layout on one hardware description (docs/PLANNER.md).
//
// Per chunk and micro-batch, on one rank (T = s/CP · b tokens, t = TP):
//   forward  f = Σ_GEMM 2mnk / (peak · eff(2mnk)) + attention + element-wise
//                + exposed TP (and CP, EP) communication
//                (--tp-comm-overlap: the GEMMs as Transformer Engine runs
//                them, in chunks and on fewer SMs; TimeOptions)
//   backward b = 2 × the GEMMs (dX and dW) + r × attention (r: the hardware's
//                attention_backward_ratio, 2.5 without) + 2 × element-wise
//                + exposed communication (Loom overlaps the backward's TP
//                reduction of dX with the dW GEMM: exposed = max(0, comm − dW))
//                + the forward again under full recomputation (the attention
//                core under selective)
// The pipeline: pipeline::Simulate runs the very schedule //train:gpt runs
// (BuildSchedule) with these per-action costs and the point-to-point
// transfer time, giving the makespan and bubble.
// Data parallelism: gradient all-reduce (or ZeRO-1's reduce-scatter +
// all-gather) of the stage's f32 gradients over DP·CP, one collective (and
// its latency, ring steps included) per layer (GradientSync's bucket); with
// --overlap-grad-reduce (--overlap-param-gather) all but the last bucket hides
// behind the last micro-batch's backward (the first's forward).
// Optimizer: Adam is memory-bound, 7·4 + e bytes per owned element (at the
// hardware's optimizer_bandwidth where measured). Element-wise kernels run at
// its elementwise_bandwidth where measured (plan/hardware.h).
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
  // Bytes per element of the gradient reduction (all-reduce, or ZeRO-1's
  // reduce-scatter): 4, f32, Loom's; also Megatron's under bf16, whose
  // arguments.py forces --accumulate-allreduce-grads-in-fp32 for bf16 ("bfloat16
  // requires gradient accumulation and all-reduce to be done in fp32") unless
  // the later opt-in --grad-reduce-in-bf16; 2 for that opt-in.
  int grad_reduce_bytes = 4;
  // How --tp-comm-overlap runs (with TP > 1 and SP): Transformer Engine's
  // userbuffers defaults (transformer_engine/pytorch/module/base.py,
  // initialize_ub): the AG-overlapped GEMMs (QKV and FC1 forward, proj and
  // FC2 dgrad) "ring_exchange", split into TP chunks of T/TP rows, their
  // transfers on the copy engines; the RS-overlapped forward GEMMs (proj, FC2)
  // "pipeline", 4 splits, with 16 SMs for the reduce-scatter kernel and the
  // GEMM given the rest (set_sm_margin); the QKV and FC1 dgrad and wgrad
  // "bulk", 16 SMs for the communication, the GEMM given the rest. The GEMM
  // of a chunk runs at the curve's efficiency for the chunk's FLOPs; SMs are
  // taken from the hardware's compute_units (0: none taken).
  int tp_overlap_comm_sms = 16;
  int tp_overlap_pipeline_splits = 4;
};

// The busiest stage's compute in one step, by kind of kernel (seconds, all
// micro-batches, forward + backward + recomputation): what //train:plan_bench
// sets against the kernels it times (core/ops/kernel_timer.h).
struct ComputeTerms {
  double gemm = 0;         // the layers' and the logits' GEMMs (linear layers)
  double attention = 0;    // the attention core (flash: QKᵀ, softmax, PV)
  double elementwise = 0;  // norms, bias, activation, dropout, residual adds
  double loss = 0;         // cross-entropy over the logits
  double embedding = 0;    // the token and position lookups and their gradients
  double optimizer = 0;    // Adam over the owned elements
  double Total() const { return gemm + attention + elementwise + loss + embedding + optimizer; }
};

struct StepTime {
  double compute = 0;         // the busiest stage's compute + the optimizer
  ComputeTerms terms;         // `compute`, by kind
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
  // --tp-comm-overlap: what chunked GEMMs on fewer SMs add to one layer's
  // forward + backward on the busiest stage, seconds (0 without it).
  double tp_overlap_cost_per_layer = 0;
  double dp_latency = 0;  // of dp_comm: the per-bucket latencies (ring steps)
  double dp_gather = 0;   // of dp_comm: the parameter all-gathers (ZeRO-1's, ZeRO-3's per unit)
};

// Model FLOPs of one step (spec: 6N + 12·L·h·s per token, N active params).
double ModelFlopsPerStep(const train::TrainConfig& c);

absl::StatusOr<StepTime> PredictStepTime(const train::TrainConfig& c, const Hardware& hw,
                                         const TimeOptions& options = {});

std::string ExplainTime(const train::TrainConfig& c, const Hardware& hw, const StepTime& t);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TIME_MODEL_H_
