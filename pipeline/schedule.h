#ifndef LOOM_PIPELINE_SCHEDULE_H_
#define LOOM_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/enum_names.h"
#include "pipeline/action.h"

namespace loom::pipeline {

// Pipeline schedules as data: for every pipeline stage, the ordered list of compute and
// communication actions it runs in one training step. Nothing here communicates; an executor
// runs the lists over point-to-point send/recv, and //pipeline:simulator times them.
//
// Vocabulary (Megatron's): P = pp stages, v = vp chunks per stage, M = micro-batches.
// Virtual stage of (pp_rank r, chunk c) is c·P + r; activations flow virtual stage
// 0 -> 1 -> ... -> P·v − 1 and grads flow back. So chunk c of the last stage feeds chunk c+1 of
// stage 0.

enum class ScheduleKind {
  kGPipe,        // all M forwards, then all M backwards
  k1F1B,         // PipeDream-flush: warm-up, one-forward-one-backward, cool-down
  kInterleaved,  // Megatron's interleaved 1F1B over v chunks per stage
  // Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the
  // backward is split into BackwardInput (I) and BackwardWeight (W) actions (action.h).
  kZBH1,  // ZB-H1: 1F1B's F/I order, stage r defers each W by r micro-batches (v = 1)
  kZBV,   // ZB-V: two chunks per stage in a V (virtual stages r and 2P − 1 − r), torch's
          // ScheduleZBVZeroBubble order (v = 2)
  // DualPipeV (DeepSeek's DualPipe cut in half, deepseek-ai/DualPipe): zbv's V placement;
  // in the steady state the forward of one chunk is paired with the full backward of the
  // other chunk for an older micro-batch (F&B: the forward's send goes out before the backward
  // runs, so its transfer hides behind the backward), the first and last phases split
  // backwards to fill the bubble. torch's ScheduleDualPipeV order (v = 2, M >= 2P).
  kDualPipeV,
};

// --pipeline-schedule's spellings (zbh1: zb-h1's alias): the flag of that type
// parses them exactly.
LOOM_ENUM_NAMES(ScheduleKind, {ScheduleKind::kGPipe, "gpipe"}, {ScheduleKind::k1F1B, "1f1b"},
                {ScheduleKind::kInterleaved, "interleaved"}, {ScheduleKind::kZBH1, "zb-h1"},
                {ScheduleKind::kZBV, "zbv"}, {ScheduleKind::kDualPipeV, "dualpipev"},
                {ScheduleKind::kZBH1, "zbh1", /*alias=*/true})

// The spellings above, any case, and torch's class names "ZBVZeroBubble" (and
// "zb-v") for zbv and "DualPipeV" for dualpipev: what //pipeline:visualize accepts. The
// error names --pipeline-schedule.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);
// "gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"
const char* ScheduleKindName(ScheduleKind kind);
// Whether the schedule runs split backwards (BackwardInput + BackwardWeight): zb-h1, zbv,
// dualpipev (its first and last phases).
bool SplitsBackward(ScheduleKind kind);
// Whether the schedule places its two chunks per stage in a V (zbv, dualpipev).
bool IsVShape(ScheduleKind kind);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;  // --pipeline-schedule
  int pp = 1;                                // --pipeline-model-parallel-size (P)
  int vp = 1;                                // --virtual-pipeline-model-parallel-size (v)
  int micro_batches = 1;                     // --micro-batches (M)
  // --microbatch-group-size-per-virtual-pipeline-stage (G), interleaved only.
  // 0 means the default, P. Must lie in [P, M] and divide M.
  int microbatch_group_size = 0;
};

// Checks the constraints above; errors are absl::InvalidArgumentError naming the flags.
// zb-h1 runs one chunk per stage (--vpp 1); zbv and dualpipev exactly two (--vpp 2), and
// dualpipev at least 2P micro-batches; none of them takes G.
absl::Status ValidateScheduleOptions(const ScheduleOptions& options);

// Placement of virtual stages. Megatron's interleaving (every schedule but the V-shaped zbv and
// dualpipev): chunk c of stage r is virtual stage c·P + r. The V: chunk 0 of stage r is virtual stage r and chunk 1
// is 2P − 1 − r, so stage P − 1 holds virtual stages P − 1 and P (a local hand-over, no
// communication) and stage 0 holds both the first and the last virtual stage.
int VirtualStageOf(const ScheduleOptions& options, int pp_rank, int chunk);
struct StageChunk {
  int pp_rank = 0;
  int chunk = 0;
};
StageChunk PlacementOf(const ScheduleOptions& options, int virtual_stage);

// Whether the schedule's lists are deadlock-free only when a send completes without its
// receive (the simulator's eager mode): the V (zbv, dualpipev) and interleaved with G > P.
// Its executor sends over BufferedLinks (pipeline/p2p.h).
bool NeedsBufferedSends(const ScheduleOptions& options);

// G after applying the default (interleaved), 1 for the other schedules.
int EffectiveGroupSize(const ScheduleOptions& options);

struct Schedule {
  ScheduleOptions options;
  std::vector<std::vector<Action>> stages;  // [P][actions in program order]
};

// Number of warm-up forwards stage `pp_rank` runs before its first backward:
//   gpipe:       M
//   1f1b:        min(P − r − 1, M)
//   interleaved: min(2(P − r − 1) + (v − 1)·G, M·v)
//   zb-h1:       min(P − r − 1, M), 1F1B's
//   zbv:         chunk forwards before the first BackwardInput, less the one it consumes:
//                2P − 1 whenever M >= 2P − 1 (torch's warm-up: 2(P − r) − 1 forwards of chunk 0,
//                then r of each chunk, then F(0, 1) I(0, 1)); fewer with fewer micro-batches.
//   dualpipev:   counted the same way: 2(P − r − 1) forwards of chunk 0, then r + 1 of each
//                chunk, then F(0, 1) I(0, 1) on stages r < P − 1: 2P − 1 on every stage.
int WarmupForwards(const ScheduleOptions& options, int pp_rank);

// Peak number of chunk activations stage `pp_rank` holds during a step (a Forward(m, c) whose
// Backward, or BackwardWeight, has not ended; //pipeline:simulator's peak_activations):
//   gpipe M, 1f1b and interleaved min(WarmupForwards + 1, M·v) (stage 0 of 1f1b: min(P, M));
//   zb-h1: min(P, M) on every stage: 1F1B's peak P − r plus the r deferred W's, so the largest
//          over stages is 1F1B's (stage 0's) and the later stages rise to it;
//   zbv: counted from the order; 2P chunk activations on every stage when M >= 2P − 1, i.e. P
//        stages' worth of layers (a chunk is half a stage): 1F1B's stage-0 peak.
//   dualpipev: counted from the order; 2P + 1 on stage 0 (DualPipe's "PP + 1" activations).
int PeakInFlightActivations(const ScheduleOptions& options, int pp_rank);

// The k-th forward (or backward) of one stage in the interleaved order, k in [0, M·v):
//   forward chunk  = (k / G) % v,  backward chunk = v − 1 − (k / G) % v,
//   micro-batch    = (k / (G·v))·G + k % G.
// For v = 1 this is simply (micro-batch k, chunk 0).
struct ChunkStep {
  int micro_batch = 0;
  int chunk = 0;
};
ChunkStep NthStep(const ScheduleOptions& options, int k, bool forward);

// Only the compute actions of one stage, in order (no sends/receives).
//   zb-h1, stage r: 1F1B's order with Backward replaced by BackwardInput and W(m) placed right
//     after I(m + r) (the remaining r W's at the end). With F = I = W and free communication
//     its bubble is (P − 1)(T_F + T_B − T_W), Qi et al.'s Table 1, a third of 1F1B's.
//   zbv: torch's ScheduleZBVZeroBubble._calculate_single_rank_operations
//     (torch/distributed/pipelining/schedules.py), generated for max(M, 2P − 1) micro-batches and
//     filtered to micro-batch < M as torch does.
//   dualpipev: torch's ScheduleDualPipeV._calculate_single_rank_operations (same file; its
//     OVERLAP_F_B compound action becomes Forward then Backward).
std::vector<Action> ComputeOrder(const ScheduleOptions& options, int pp_rank);

// The full schedule: each stage's compute order with the implied communication inserted in
// Megatron's batches (zb-h1 and zbv as 1F1B: every compute action a step; BackwardWeight moves
// no tensor). The compute order is cut into steps (one compute action; in the
// interleaved steady state the Forward + Backward pair);
// after each step comes one batch with
// the step's sends and the next step's receives. So 1F1B's steady state has the batches
// "SendActivation, RecvGrad" and "SendGrad, RecvActivation", and interleaved's steady state
// one four-way batch. The lists are deadlock-free with buffered sends; with blocking
// (rendezvous) sends too whenever G = P, Megatron's default. With G > P, stage P-1's warm-up
// sends wrap around to stage 0 long before it receives them: the executor must buffer them
// (non-blocking isend whose completion it does not wait for at once).
//
// Executor contract: activations and grads between the same pair of stages (P = 2, and the
// wrap-around link of interleaved) must be told apart (e.g. by a message tag); within one kind
// the k-th send on a (src, dst) link matches the k-th receive.
absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& options);

// The forward-only schedule of `options` (evaluation / inference: Megatron's forward_only=True):
// every stage runs Forward(m, c) once for each of its M·v (micro-batch, chunk) pairs, in the
// training order: the k-th forward is NthStep(options, k, /*forward=*/true), so activations and
// dropout streams are the training step's. The lists hold only kForward, kRecvActivation and
// kSendActivation: Forward(m, c) is preceded by RecvActivation(m, c) unless it is virtual stage 0
// (or P = 1, where inputs are local), and SendActivation(m, c) is in the batch right after it
// unless it is the last virtual stage (or P = 1). Options are validated as by BuildSchedule
// (same errors); schedule.options is `options`, kind included (GPipe and 1F1B give the same
// lists: with no backward, everything is warm-up).
//
// Batches (as in BuildSchedule, one per compute step): the receives of the first forward, then
// after the k-th forward one batch with its send and the next forward's receive. Number the
// batch after forward k on stage r (k = −1: the one before the first forward) T = k + r: every
// send and its receive sit in batches with the same T, so posting batch T needs only batches
// < T done, and the lists are deadlock-free with buffered and with blocking (rendezvous) sends,
// for every G. On the wrap-around link (stage P − 1, chunk c -> stage 0, chunk c + 1) this puts
// the receive for stage 0's k-th forward in the batch after its forward k − 1 − (G − P): the
// batch right before it when G = P (Megatron's default; BuildSchedule's placement),
// G − P forwards earlier when G > P (receiving it right before its forward would deadlock
// with blocking sends, as the training schedule does).
//
// Memory: nothing is kept for a backward. The peak number of live activations (saved records)
// is 1 on every stage: the forward that is running; its record is freed when it ends. Between
// forwards a stage holds only boundary tensors: its last output until the batch right after it
// sends it, and received inputs until their forward: 1, or up to G − P + 1 on stage 0 of the
// interleaved schedule. (Training holds up to WarmupForwards(r) + 1 records.)
// Time, with forward cost f per chunk and free communication: stage r runs its k-th forward at
// (k + r)·f, so the makespan is (M·v + P − 1)·f and the bubble (P − 1)/(M·v).
//
// Executor contract: BuildSchedule's. Only activations travel (no grads share a link with
// them), and the k-th SendActivation on a (src, dst) link matches the k-th RecvActivation there.
//
// zb-h1 gives 1f1b's forward-only lists (kind kept). The V (zbv, dualpipev): every stage runs
// chunk 0's M forwards, then chunk 1's, a receive right before each and a send right after;
// deadlock-free with buffered sends and tagged channels, as the V's training lists need.
absl::StatusOr<Schedule> BuildForwardOnlySchedule(const ScheduleOptions& options);

}  // namespace loom::pipeline

#endif  // LOOM_PIPELINE_SCHEDULE_H_
