#ifndef LOOM_PLAN_MEMORY_MODEL_H_
#define LOOM_PLAN_MEMORY_MODEL_H_

// Peak memory per rank by category, as Loom allocates it (core/memory_stats.h
// categories; the formulas are docs/PLANNER.md's and were fitted to what
// //tests:plan_memory_model_test measures with the local backend).
//
//   parameters   4·n_pad (+ 2·n_pad with --bf16: the compute copy)
//   gradients    4·n_pad                           (f32 always)
//   optimizer    8·n_pad / g with ZeRO-1, else 8·n_pad  (Adam m, v)
//     (g here: the ranks the strategy shards over, DP·CP / N with
//     --num-distributed-optimizer-instances N; the padding stays DP·CP's)
//   ZeRO-2 (optim_grads): gradients 4·n_pad / g + GradientSync's bucket pool
//     at its peak (replayed over the step's backward events from the schedule's
//     action list: split backwards hold buckets from I to W)
//   ZeRO-3 (optim_grads_params): also parameters 4·n_pad / g, and the
//     gathered buckets (4 B, + 2 with --bf16, per element; ReplayStep)
//     under communication
//     n_pad: the stage's local parameters, each slot padded to a multiple of
//     the gradient group g = DP·CP (ParamBuffer); local = global/TP for split ones.
//   activations  a·K_chunk + K_head + W + R
//     a: chunk activations in flight on the stage: min(warm-up + 1, M·v) (the
//        pipeline simulator's peak_activations for the same schedule);
//     K_chunk: what one micro-batch keeps for a chunk of Lc layers
//        (Xs + Lc·K_layer, or the recomputation's share of it);
//     K_layer = SP ? 16·X/t + N/t + P : (4 + 12/t)·X + N + P for GPT-2
//        (X = s/c·b·h·e the hidden state, t = TP, c = CP, e = dtype bytes,
//        N = 4·s/c·b·4 LayerNorm statistics, P = b·H/t·s/c·4 the flash kernel's lse;
//        the 12 generalises to (H+2G)/H + 1 (+ (H+G)/H with RoPE) + (2 or 3 with
//        SwiGLU)·F/h, × top-k for MoE, whose layers add k·Xs·(4 + 6·(EP−1)/EP));
//     K_head (last stage): Xs + s/c·b·V/t·4 (logits) + statistics;
//     W: the backward's working set; R: what recomputation reruns at once.
//   communication: staging of the collectives (DP buckets, TP/SP gathers).

#include <string>
#include <vector>

#include "config/config.h"

namespace loom::plan {

struct MemoryBreakdown {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double communication = 0;
  double total() const { return parameters + gradients + optimizer + activations + communication; }
};

struct StageMemory {
  int pp_rank = 0;
  int in_flight = 0;  // chunk activations held at the peak
  MemoryBreakdown bytes;
};

// Local parameter elements of pipeline stage `pp_rank` (padded slots).
int64_t StageParameters(const train::TrainConfig& c, int pp_rank);
// The MoE experts' among them (ParamSpec::expert): under EP, ZeRO-1 shards
// those over the expert-data-parallel ranks (DP / EP), the rest over DP x CP.
int64_t StageExpertParameters(const train::TrainConfig& c, int pp_rank);

// GradientSync's transient memory on stage `pp_rank`, replayed over the unit
// events of a step of `micro_batches` micro-batches (the schedule's action
// list, pipeline::ComputeOrder; GptModel's events per action):
//   bucket_pool_bytes  ZeRO-2/3: the gradient bucket buffers allocated at the
//     peak (a bucket bound from a writer's BeforeBackward, at I under a split
//     backward, until every writer has run and none is open, its W; the pool
//     keeps and reuses its buffers);
//   gathered_bytes  ZeRO-3: the gathered parameter buckets held at once (f32
//     and the --bf16 copy; a unit's from its before- to its after-event, a
//     split backward's from I to W, the prefetched neighbour's with
//     --overlap-param-gather).
struct ReplayPeaks {
  int64_t bucket_pool_bytes = 0;
  int64_t gathered_bytes = 0;
};
ReplayPeaks ReplayStep(const train::TrainConfig& c, int pp_rank, int micro_batches);
// The micro-batches PredictMemory replays: min(M, 4 P). Past the warm-up the
// schedules repeat per micro-batch and the peaks with them
// (//plan:memory_model_test checks that against the whole step).
int ReplayedMicroBatches(const train::TrainConfig& c);

// Every stage's peak (`in_flight[r]`: chunk activations held by stage r;
// empty: pipeline::PeakInFlightActivations(r), i.e. min(WarmupForwards(r) + 1, M·v) but for
// zb-h1, whose records also wait for their W).
std::vector<StageMemory> PredictMemory(const train::TrainConfig& c,
                                       const std::vector<int>& in_flight = {});

// The stage with the largest total.
StageMemory PeakMemory(const std::vector<StageMemory>& stages);

// The formulas of one stage with its numbers (for --explain).
std::string ExplainMemory(const train::TrainConfig& c, const StageMemory& stage);

}  // namespace loom::plan

#endif  // LOOM_PLAN_MEMORY_MODEL_H_
