#ifndef LOOM_LAYERS_MOE_H_
#define LOOM_LAYERS_MOE_H_

// Mixture of experts: Megatron's MoE layer (router, top-k, load-balancing and
// z losses, capacity with token dropping or dropless, token permutation)
// with experts split over TP like the dense MLP, and over the ranks of an
// expert-parallel group (each holds E/EP experts; tokens travel to their
// experts and back by all-to-all-v, their counts exchanged first).
//
// Data path of one MoE layer on T = s·b tokens (the whole sequence: under
// sequence parallelism the input is all-gathered first, so every TP rank
// routes the same tokens the same way):
//   logits = x·Wrᵀ [T, E] (f32) -> Route: top-K experts per token, probs =
//   softmax over the K chosen logits (Mixtral's and Megatron's default),
//   capacity drop -> dispatch: the assignments' rows gathered into one
//   [N, h] buffer, grouped by expert (token order within an expert) -> per
//   expert: fc1 [n_e, f/p] (SwiGLU: [n_e, 2f/p]), activation, fc2 [n_e, h]
//   (a partial sum over TP) -> combine: y_t = Σ_k prob_tk · out_row(t,k) ->
//   all-reduce over TP (SP: reduce-scatter along s).
// Under expert parallelism each EP rank routes its own tokens; the dispatch
// buffer, grouped by expert, is grouped by owning rank too, so one
// all-to-all-v sends each rank the rows of its experts (arriving by source,
// then expert; a permutation makes them expert-major), and the inverse
// brings the experts' outputs back in dispatch order.
// With --moe-a2a-overlap-chunks N > 1 under EP the routed micro-batch is
// cut into N chunks of consecutive tokens after routing (so capacity drops
// and the losses are the whole micro-batch's) and pipelined: chunk k+1's
// dispatch and chunk k-1's combine all-to-all are in flight while chunk k's
// experts compute (forward and backward; ChunkPlan's layouts); the weight
// gradients run once per expert over all its rows, while the last combine is
// in flight. Routing, drops and losses are N = 1's bit for bit; outputs and
// gradients within a GEMM's rounding (a chunk's expert GEMMs have fewer rows,
// and oneDNN rounds a row by the GEMM's shape; the same bits where each
// expert's rows lie in one chunk).
// Backward mirrors it; the probabilities' gradient ⟨dy_t, out_row⟩ is summed
// over TP (the rows are partial), the router's input gradient is complete on
// every TP rank and added after the experts' reduction.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "core/tensor.h"
#include "layers/context_parallel.h"
#include "layers/params.h"
#include "layers/tp_group.h"

namespace loom::layers {

struct MoeOptions {
  int64_t experts = 0;
  int64_t topk = 2;
  bool swiglu = false;
  bool aux_loss = true;          // --moe-router-load-balancing-type=aux_loss
  float aux_loss_coeff = 0.0f;
  float z_loss_coeff = 0.0f;
  float capacity_factor = 0.0f;  // 0: dropless
  bool pad_to_capacity = false;
  bool grouped_gemm = false;     // --moe-grouped-gemm: the experts' GEMMs side by side
  int64_t a2a_overlap_chunks = 1;  // --moe-a2a-overlap-chunks (1: off; only under EP)
};

// What the router decided for T tokens, and where each assignment sits in
// the dispatched buffer.
struct Routing {
  int64_t tokens = 0, topk = 0, experts = 0;
  std::vector<int32_t> expert;  // [T, K]: chosen experts, by descending logit
  // [T, K]: softmax over the K chosen logits (before any drop: the backward's
  // Jacobian needs them); an assignment dropped by the capacity has weight 0.
  std::vector<float> prob;
  std::vector<int32_t> row;  // [T, K]: its row in the dispatched buffer, -1 if dropped
  std::vector<int64_t> tokens_per_expert;  // [E] assignments before the capacity
  std::vector<int64_t> expert_rows;        // [E + 1]: expert e owns rows [r_e, r_{e+1})
  std::vector<int32_t> row_token;          // [N]: the token of each row (-1: padding)
  int64_t capacity = 0;                    // 0: dropless
  int64_t dropped = 0;                     // assignments over the capacity
  std::vector<double> score_sum;           // [E]: Σ_t softmax(logits_t)_e
  // The load-balancing loss's statistics: this rank's, or under context
  // parallelism the whole micro-batch's (summed over the CP group), with the
  // gradient of this rank's tokens scaled by CP (the gradient sync averages
  // over DP x CP).
  std::vector<int64_t> aux_counts;  // [E] assignments per expert
  int64_t aux_tokens = 0;
  double aux_grad_scale = 1;
  double aux_loss = 0;                     // coefficient included
  double z_loss = 0;
  // The per-token decisions on the logits' device (the kernels' inputs; on
  // the CPU the vectors above hold the same values, elsewhere they stay
  // empty: only the counts and offsets come to the host).
  core::Tensor expert_t;     // i32 [T, K]
  core::Tensor prob_t;       // f32 [T, K]
  core::Tensor row_t;        // i32 [T, K]
  core::Tensor row_token_t;  // i32 [N]

  bool kept(int64_t t, int k) const { return row[t * topk + k] >= 0; }
};

// Routes T tokens from their router logits [T, E] (host f32). Deterministic:
// ties go to the lower expert index, and under a capacity the more probable
// assignments stay (ties: the earlier token), so every layout drops the same.
absl::StatusOr<Routing> Route(const float* logits, int64_t tokens, const MoeOptions& options);
// The same on the device of `logits` (f32 [T, E]) through core/ops; only the
// statistics (2E + 1 values: counts, probability sums, z sum) come to the host.
absl::StatusOr<Routing> RouteOnDevice(const core::Tensor& logits, const MoeOptions& options);

// dlogits [T, E] (host f32, written) from the gradient of the combine
// weights dprob [T, K] and the load-balancing and z losses' gradients scaled
// by `loss_weight` (the micro-batch's weight in the objective).
void RouterBackward(const Routing& routing, const float* logits, const float* dprob,
                    float loss_weight, const MoeOptions& options, float* dlogits);

// The expert-parallel group an MoE layer runs in (explicit, like TpGroup):
// rank r holds experts [r·E/EP, (r+1)·E/EP). Size 1 (comm may be null): all.
struct EpGroup {
  comm::Communicator* comm = nullptr;
  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool parallel() const { return size() > 1; }
  ExpertShard shard() const { return {rank(), size()}; }
};

// How one micro-batch's assignment rows reach this rank's experts and come
// back (the all-to-all-v plan; without EP the identity).
struct ExpertExchange {
  std::vector<int64_t> send, recv;  // elements to / from each EP rank (rows x h)
  // Expert-major row i at this rank's experts is received row perm[i];
  // inverse[j] is where received row j went (both empty without EP).
  std::vector<int32_t> perm, inverse;
  std::vector<int64_t> local_rows;  // [E/EP + 1]: local expert l owns rows [r_l, r_{l+1})
  core::Tensor perm_t, inverse_t;   // perm and inverse (i32) on the activations' device
};

// Local expert l's rows at this rank's experts: [first, first + count).
using ExpertRows = std::vector<std::pair<int64_t, int64_t>>;

// The chunked exchange of one micro-batch (--moe-a2a-overlap-chunks C > 1
// under EP): chunk c holds the kept assignments of tokens t with
// floor(t·C/T) = c (padding rows: the last chunk). The dispatched buffer is
// chunk-major (chunk, expert, token); the rows at this rank's experts stay
// expert-major (local expert, chunk, source rank, token), so a chunk's rows
// of an expert are one block and an expert's rows of all chunks too.
struct ChunkPlan {
  std::vector<int64_t> dispatch_rows;  // [C + 1]: chunk c's rows of the dispatched buffer
  // [C]: each chunk's all-to-all plan: its perm and local_rows are the
  // chunk's own (received rows to its expert-major order); its inverse
  // indexes the layer's expert rows (where its combine sends from).
  std::vector<ExpertExchange> chunk;
  std::vector<ExpertRows> rows;        // [C][E/EP]: chunk c's block of each local expert
  core::Tensor row_token_t;            // i32 [N]: the token of each dispatched row (-1: padding)
  core::Tensor row_t;                  // i32 [T, K]: each assignment's dispatched row (-1: dropped)
  int64_t chunks() const { return static_cast<int64_t>(chunk.size()); }
};

// Optional instrumentation of the expert-parallel all-to-alls (the counts
// exchange and the dispatch and combine, forward and backward), for the
// bench: wall times accumulated over every Forward and Backward while set
// (MoeMlp::set_comm_stats; null, the default, measures nothing). Numerics are
// the same either way. Not thread-safe: one per rank.
struct MoeCommStats {
  int64_t calls = 0;       // all-to-alls timed
  // Wall time with at least one all-to-all in flight (from its issue call to
  // its observed completion), forward (counts exchange included) and
  // backward: chunks' overlapping exchanges count once.
  double forward_ms = 0;
  double backward_ms = 0;
  double blocked_ms = 0;   // of those, time the rank spent in an issue call, Poll or Wait
  // The share of the in-flight time the rank was computing instead (0 while
  // every all-to-all is waited on as soon as it is issued). With chunks,
  // completion is observed by a Poll after each chunk's experts or by the
  // Wait, and an exchange waiting for a slower peer is in flight too: an
  // upper bound on what the overlap hid.
  double hidden_fraction() const {
    const double span = forward_ms + backward_ms;
    return span > 0 ? std::max(0.0, 1.0 - blocked_ms / span) : 0.0;  // max: rounding
  }
  // Bookkeeping of the in-flight union (MoeMlp's, not a result).
  int in_flight = 0;
  std::chrono::steady_clock::time_point busy_since;
};

class MoeMlp {
 public:
  struct Saved {
    core::Tensor input;       // [T, h] all tokens (SP: gathered)
    core::Tensor logits;      // [T, E] f32
    Routing routing;
    ExpertExchange exchange;
    core::Tensor dispatched;  // [N, h]: this rank's assignments, grouped by expert
    core::Tensor expert_in;   // [M, h]: the rows at this rank's experts (no EP: dispatched)
    core::Tensor pre_act;     // [M, f/p] (SwiGLU: [M, 2f/p])
    core::Tensor act;         // [M, f/p]
    core::Tensor expert_out;  // [N, h]: the experts' outputs of `dispatched`, partial over TP
    // Chunked (chunks.chunks() > 0): dispatched and expert_out are
    // chunk-major, expert_in, pre_act and act expert-major with chunks
    // inside each expert (ChunkPlan); exchange holds only their local_rows.
    ChunkPlan chunks;
    int64_t Bytes() const;    // for memory accounting
  };
  // fc1[l], fc2[l]: local expert l's dense_h_to_4h and dense_4h_to_h weights
  // (TP shards; expert ep.shard().first(E) + l).
  // `cp`: the context-parallel group, over which the load-balancing loss
  // counts the micro-batch's tokens (capacity is refused with CP).
  MoeMlp(Param* router, std::vector<Param*> fc1, std::vector<Param*> fc2, const MoeOptions& options,
         TpGroup tp, EpGroup ep = {}, CpGroup cp = {})
      : router_(router),
        fc1_(std::move(fc1)),
        fc2_(std::move(fc2)),
        options_(options),
        tp_(tp),
        ep_(ep),
        cp_(cp) {}

  // Accumulates the all-to-alls' wall times into `stats` from now on (null:
  // stop). Must outlive the calls it measures.
  void set_comm_stats(MoeCommStats* stats) { comm_stats_ = stats; }

  // x: [s(/p), b, h] -> [s(/p), b, h]: host f32, or on a device (the
  // router's and experts' weights' device and dtype) f32 or bf16; the router's
  // logits and probabilities are f32 everywhere.
  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, Saved* saved) const;
  // dy: [s(/p), b, h]; accumulates the router's and experts' gradients.
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, float loss_weight,
                                        const Saved& saved) const;

 private:
  // Collective over CP: the load-balancing statistics of the micro-batch.
  absl::Status AuxStatsOverCp(Routing* r) const;
  // Collective over EP: the counts of every (rank, local expert) pair.
  absl::StatusOr<ExpertExchange> PlanExchange(const Routing& routing, int64_t h) const;
  // Whether this layer pipelines chunks (--moe-a2a-overlap-chunks > 1 under EP).
  bool chunked() const { return options_.a2a_overlap_chunks > 1 && ep_.parallel(); }
  // Collective over EP: the chunk-major layout and every chunk's exchange
  // (one counts all-to-all for all chunks); saved->exchange.local_rows.
  absl::Status PlanChunks(const Routing& routing, int64_t h, Saved* saved) const;
  // Dispatch, experts and combine, chunk by chunk: saved->dispatched ..
  // expert_out (chunk-major).
  absl::Status ForwardChunks(Saved* saved) const;
  // The experts' input gradients chunk by chunk (dout: chunk-major [N, h]),
  // their weight gradients deferred as in Backward; returns the dispatched
  // rows' gradients (chunk-major [N, h]).
  absl::StatusOr<core::Tensor> BackwardChunks(const Saved& saved, const core::Tensor& dout) const;
  // The local experts on their rows of the tensors (`rows`: each expert's
  // block): forward, input gradients, and the weight gradients accumulated
  // into the experts' grads.
  // Chunk rows received by source (x.perm's order) into their blocks `rows`
  // of `expert_rows`.
  absl::Status ToExpertRows(const ExpertExchange& x, const ExpertRows& rows,
                            const core::Tensor& received, const core::Tensor& expert_rows) const;
  absl::Status ExpertsForward(const ExpertRows& rows, const core::Tensor& in,
                              core::Tensor pre, core::Tensor act, core::Tensor out) const;
  absl::Status ExpertsBackwardInput(const ExpertRows& rows, const core::Tensor& pre,
                                    const core::Tensor& dout, core::Tensor dact,
                                    core::Tensor dpre, core::Tensor din) const;
  absl::Status ExpertsWeightGrad(const ExpertRows& rows, const core::Tensor& in,
                                 const core::Tensor& act, const core::Tensor& dout,
                                 const core::Tensor& dpre) const;
  // Assignment rows [N, h] to the experts' rows [M, h], and back (`backward`:
  // which of comm_stats_'s times the all-to-all counts in).
  absl::StatusOr<core::Tensor> ToExperts(const ExpertExchange& x, const core::Tensor& rows,
                                         bool backward) const;
  absl::StatusOr<core::Tensor> FromExperts(const ExpertExchange& x, const core::Tensor& rows,
                                           bool backward) const;

  Param* router_;
  std::vector<Param*> fc1_, fc2_;
  MoeOptions options_;
  TpGroup tp_;
  EpGroup ep_;
  CpGroup cp_;
  MoeCommStats* comm_stats_ = nullptr;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_MOE_H_
