#include "plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"
#include "models/gpt/gpt_config.h"
#include "pipeline/layer_assignment.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "plan/memory_model.h"

namespace loom::plan {
namespace {

// Costs of one layer's forward and backward for one micro-batch, seconds.
struct LayerCost {
  double fwd_compute = 0, bwd_compute = 0;  // GEMMs, attention, element-wise
  double fwd_comm = 0, bwd_comm = 0;        // exposed TP, CP, EP
  double attention_fwd = 0;                 // what selective recomputation reruns
  double tp_overlap_cost = 0;               // of fwd + bwd compute: --tp-comm-overlap's
  // A split backward (zb-h1): its W, the weight-gradient GEMMs (the forward's
  // sizes), and the TP reduction of dX they hid, exposed at I without them.
  double weight_grad = 0, dw_hidden_comm = 0;
  ComputeTerms fwd_terms, bwd_terms;  // fwd_compute and bwd_compute by kind
};

ComputeTerms& operator+=(ComputeTerms& a, const ComputeTerms& b) {
  a.gemm += b.gemm;
  a.attention += b.attention;
  a.elementwise += b.elementwise;
  a.loss += b.loss;
  a.embedding += b.embedding;
  a.optimizer += b.optimizer;
  return a;
}

ComputeTerms Scaled(ComputeTerms a, double k) {
  a.gemm *= k;
  a.attention *= k;
  a.elementwise *= k;
  a.loss *= k;
  a.embedding *= k;
  a.optimizer *= k;
  return a;
}

struct Ctx {
  const train::TrainConfig& c;
  const Hardware& hw;
  TimeOptions options;
  int ranks_on_node = 1;
  double e = 2;          // compute dtype bytes
  double T = 0;          // tokens per micro-batch per rank (s/CP · b)
  double s_local = 0;
  bool tp_inter = false, cp_inter = false, ep_inter = false, dp_inter = false, pp_inter = false;
};

double Gemm(const Ctx& x, double m, double n, double k) {
  return GemmSeconds(x.hw, m, n, k, x.ranks_on_node);
}

LayerCost Layer(const Ctx& x, bool moe) {
  const layers::GptConfig& m = x.c.model;
  const double t = x.c.tensor_model_parallel_size, cp = x.c.context_parallel_size;
  const double h = m.hidden_size, heads = m.num_attention_heads, d = m.head_dim();
  const double groups = m.query_groups(), ffn = m.ffn(), T = x.T;
  const double up = (m.swiglu ? 2 : 1) * ffn;
  LayerCost l;
  // GEMMs (forward); the backward's dX and dW GEMMs are the same sizes.
  const double qkv_n = (heads + 2 * groups) * d / t, proj_k = heads * d / t;
  double attn_gemm = Gemm(x, T, qkv_n, h) + Gemm(x, T, h, proj_k);
  double mlp_gemm;
  double experts_gemm = 0, chunking_cost = 0;  // the local experts' forward GEMMs
  const double a2a_chunks =
      moe && x.c.expert_model_parallel_size > 1 ? std::max<int64_t>(1, m.moe_a2a_overlap_chunks) : 1;
  if (moe) {
    const double E = m.num_experts, ep = x.c.expert_model_parallel_size, k = m.moe_router_topk;
    const double rows = T * k * ep / E;  // rows per local expert (balanced routing)
    experts_gemm = (E / ep) * (Gemm(x, rows, up / t, h) + Gemm(x, rows, h, ffn / t));
    mlp_gemm = experts_gemm + Gemm(x, T, E, h);
    if (a2a_chunks > 1) {
      // --moe-a2a-overlap-chunks: the forward and the dX GEMMs run per chunk of rows (smaller,
      // at the curve's efficiency for their FLOPs); the weight gradients once over all rows.
      const double r = rows / a2a_chunks;
      const double chunked =
          a2a_chunks * (E / ep) * (Gemm(x, r, up / t, h) + Gemm(x, r, h, ffn / t));
      chunking_cost = chunked - experts_gemm;
    }
  } else {
    mlp_gemm = Gemm(x, T, up / t, h) + Gemm(x, T, h, ffn / t);
  }
  // --tp-comm-overlap (TimeOptions): the same GEMMs as Transformer Engine's
  // userbuffers run them. ring: TP chunks of T/TP rows; pipe: `splits` chunks
  // on the SMs the reduce-scatter kernel leaves; bulk: whole, on those SMs.
  double fwd_gemm = attn_gemm + mlp_gemm, bwd_gemm = 2 * (attn_gemm + mlp_gemm);
  const bool ub = x.options.tp_comm_overlap && t > 1 && x.c.sequence_parallel;
  if (ub) {
    const double units = x.hw.compute_units();
    const double sm_left =
        units > 0 ? std::max(0.0, units - x.options.tp_overlap_comm_sms) / units : 1.0;
    const double splits = std::max(1, x.options.tp_overlap_pipeline_splits);
    auto ring = [&](double n, double k) { return t * Gemm(x, T / t, n, k); };
    auto pipe = [&](double n, double k) { return splits * Gemm(x, T / splits, n, k) / sm_left; };
    auto bulk = [&](double n, double k) { return Gemm(x, T, n, k) / sm_left; };
    auto plain = [&](double n, double k) { return Gemm(x, T, n, k); };
    // Attention block: QKV (AG ring), proj (RS pipeline); backward: QKV
    // dgrad + wgrad bulk, proj dgrad ring, proj wgrad plain.
    double f = ring(qkv_n, h) + pipe(h, proj_k);
    double b = 2 * bulk(qkv_n, h) + ring(h, proj_k) + plain(h, proj_k);
    if (!moe) {  // the dense MLP: FC1 like QKV, FC2 like proj
      f += ring(up / t, h) + pipe(h, ffn / t);
      b += 2 * bulk(up / t, h) + ring(h, ffn / t) + plain(h, ffn / t);
    } else {
      f += mlp_gemm;
      b += 2 * mlp_gemm;
    }
    l.tp_overlap_cost = (f - fwd_gemm) + (b - bwd_gemm);
    fwd_gemm = f;
    bwd_gemm = b;
  }
  // Causal flash attention: QKᵀ and PV over half of the s × s/CP blocks.
  const double attn_flops = 2 * 2 * T * (x.s_local * cp) * (heads / t) * d * 0.5;
  const double attention = AttentionSeconds(x.hw, attn_flops, x.ranks_on_node);
  const double attention_bwd = AttentionBackwardRatio(x.hw) * attention;
  // Element-wise (LayerNorm, dropout, residual on the hidden state; bias and
  // activation on the MLP's), bytes read + written.
  const double xf = T * h * x.e;
  const double xs = x.c.sequence_parallel ? xf / t : xf;
  const double elementwise =
      ElementwiseSeconds(x.hw, 12 * xs + (2 * up / h + 4) * xf / t, x.ranks_on_node);
  const double gemm = attn_gemm + mlp_gemm;
  l.fwd_compute = fwd_gemm + attention + elementwise + chunking_cost;
  l.bwd_compute = bwd_gemm + attention_bwd + 2 * elementwise + chunking_cost;
  l.fwd_terms.gemm = fwd_gemm + chunking_cost;
  l.fwd_terms.attention = attention;
  l.fwd_terms.elementwise = elementwise;
  l.bwd_terms.gemm = bwd_gemm + chunking_cost;
  l.bwd_terms.attention = attention_bwd;
  l.bwd_terms.elementwise = 2 * elementwise;
  l.attention_fwd = attention;
  // TP: two all-reduces (or all-gather + reduce-scatter pairs under SP, the
  // same bus time) of the hidden state forward, two backward.
  double tp = 0;
  if (t > 1) {
    tp = x.c.sequence_parallel
             ? 2 * (CollectiveSeconds(x.hw, CollectiveKind::kAllGather, xf, t, x.tp_inter) +
                    CollectiveSeconds(x.hw, CollectiveKind::kReduceScatter, xf, t, x.tp_inter))
             : 2 * CollectiveSeconds(x.hw, CollectiveKind::kAllReduce, xf, t, x.tp_inter);
    if (x.c.sequence_parallel) tp /= 2;  // one AG + one RS per linear pair = one all-reduce
  }
  l.fwd_comm = x.options.tp_comm_overlap ? std::max(0.0, tp - fwd_gemm) : tp;
  l.bwd_comm = std::max(0.0, tp - gemm);  // dX reduction overlapped with the dW GEMM
  l.weight_grad = gemm;
  l.dw_hidden_comm = tp - l.bwd_comm;
  // CP: K and V around the ring, overlapped with the attention blocks.
  if (cp > 1) {
    const double kv = 2 * T * groups / t * d * x.e;
    const double ring = (cp - 1) * CollectiveSeconds(x.hw, CollectiveKind::kSendRecv, kv, 2, x.cp_inter);
    l.fwd_comm += std::max(0.0, ring - attention);
    l.bwd_comm += std::max(0.0, 2 * ring - attention_bwd);
  }
  // EP: dispatch and combine all-to-alls, forward and backward; not hidden, or with
  // --moe-a2a-overlap-chunks N pipelined with the experts: the first chunk's dispatch and the
  // last one's combine stay exposed (comm / N), and each of the N - 1 steps between hides its
  // chunk's two exchanges behind a chunk's expert GEMMs (forward: experts / N; backward: their
  // dX GEMMs, the same FLOPs).
  if (moe && x.c.expert_model_parallel_size > 1) {
    const double bytes = T * m.moe_router_topk * h * x.e;
    const double a2a = 2 * CollectiveSeconds(x.hw, CollectiveKind::kAllToAll, bytes,
                                             x.c.expert_model_parallel_size, x.ep_inter);
    const double n = a2a_chunks;
    const double chunk_compute = (experts_gemm + chunking_cost) / n;
    const double exposed = n > 1 ? a2a / n + (n - 1) * std::max(0.0, a2a / n - chunk_compute) : a2a;
    l.fwd_comm += exposed;
    l.bwd_comm += exposed;
  }
  return l;
}

}  // namespace

double ModelFlopsPerStep(const train::TrainConfig& c) {
  const layers::GptConfig& m = c.model;
  const double per_token = 6.0 * static_cast<double>(layers::ActiveParameterCount(m)) +
                           12.0 * m.num_layers * m.hidden_size * m.seq_length;
  return per_token * static_cast<double>(c.global_batch_size) * m.seq_length;
}

absl::StatusOr<StepTime> PredictStepTime(const train::TrainConfig& c, const Hardware& hw,
                                         const TimeOptions& options) {
  Ctx x{c, hw, options};
  const int dpn = std::max(1, hw.devices_per_node());
  x.ranks_on_node = std::min(c.world_size, dpn);
  x.e = hw.compute_dtype_bytes() > 0 ? hw.compute_dtype_bytes() : (c.bf16 ? 2 : 4);
  const int tp = c.tensor_model_parallel_size, cp = c.context_parallel_size;
  const int dp = c.data_parallel_size, pp = c.pipeline_model_parallel_size;
  // Rank order (comm/grid.h): TP fastest, then CP, DP, PP.
  x.tp_inter = tp > dpn;
  x.cp_inter = tp * cp > dpn;
  x.ep_inter = tp * cp * c.expert_model_parallel_size > dpn;
  x.dp_inter = tp * cp * dp > dpn;
  x.pp_inter = c.world_size > dpn;
  x.s_local = static_cast<double>(c.model.seq_length) / cp;
  x.T = x.s_local * c.micro_batch_size;
  const layers::GptConfig& m = c.model;
  const LayerCost dense = Layer(x, false);
  const LayerCost moe = m.moe() ? Layer(x, true) : dense;

  // Embedding (first virtual stage) and head (last): the logits GEMM, the
  // vocab-parallel cross-entropy and its TP all-reduces.
  const double t = tp;
  const double vocab = static_cast<double>(layers::EmbeddingParamSpecs(m, tp)[0].global_shape.dim(0));
  const double xf = x.T * m.hidden_size * x.e;
  const double logits_gemm = GemmSeconds(hw, x.T, vocab / t, m.hidden_size, x.ranks_on_node);
  const double ce = MemorySeconds(hw, 6 * x.T * vocab / t * 4, x.ranks_on_node);
  const double head_fwd = logits_gemm + ce + ElementwiseSeconds(hw, 4 * xf, x.ranks_on_node);
  const double head_bwd = 2 * logits_gemm + ce + ElementwiseSeconds(hw, 8 * xf, x.ranks_on_node);
  const double embed_fwd = MemorySeconds(hw, 3 * xf, x.ranks_on_node) +
                           (tp > 1 ? CollectiveSeconds(hw, CollectiveKind::kAllReduce, xf, tp, x.tp_inter) : 0);
  const double embed_bwd = MemorySeconds(hw, 3 * xf, x.ranks_on_node);

  const int vp = c.virtual_pipeline_size;
  // Per (stage, chunk): forward and backward seconds, and the pure-compute share.
  std::vector<std::vector<double>> fwd(pp, std::vector<double>(vp)), bwd = fwd, pure = fwd;
  // zb-h1's split of bwd: W (weight-gradient GEMMs) and I (the rest, with the
  // dX reductions the dW GEMMs no longer hide).
  std::vector<std::vector<double>> bwd_w = fwd, bwd_i = fwd;
  std::vector<std::vector<ComputeTerms>> pure_terms(pp, std::vector<ComputeTerms>(vp));
  for (int r = 0; r < pp; ++r) {
    for (int ch = 0; ch < vp; ++ch) {
      auto range = pipeline::LayersOf(static_cast<int>(m.num_layers), pp, vp, r, ch);
      if (!range.ok()) return range.status();
      double f = 0, b = 0, compute = 0, w = 0, exposed = 0;
      ComputeTerms& terms = pure_terms[r][ch];
      for (int l = range->first; l < range->end(); ++l) {
        const LayerCost& lc = m.moe_layer(l) ? moe : dense;
        f += lc.fwd_compute + lc.fwd_comm;
        w += lc.weight_grad;
        exposed += lc.dw_hidden_comm;
        double bc = lc.bwd_compute, bm = lc.bwd_comm;
        terms += lc.fwd_terms;
        terms += lc.bwd_terms;
        if (m.recompute_full()) {
          bc += lc.fwd_compute;
          bm += lc.fwd_comm;
          terms += lc.fwd_terms;
        } else if (m.recompute_selective()) {
          bc += lc.attention_fwd;
          terms.attention += lc.attention_fwd;
        }
        b += bc + bm;
        compute += lc.fwd_compute + bc;
      }
      const int virtual_stage = pipeline::VirtualStage(pp, r, ch);
      if (virtual_stage == 0) {
        f += embed_fwd;
        b += embed_bwd;
        compute += embed_fwd + embed_bwd;
        terms.embedding += embed_fwd + embed_bwd;  // (with its TP all-reduce)
      }
      if (virtual_stage == pp * vp - 1) {
        f += head_fwd;
        b += head_bwd;
        w += logits_gemm;
        compute += head_fwd + head_bwd;
        terms.gemm += 3 * logits_gemm;
        terms.loss += 2 * ce;
        terms.elementwise += head_fwd + head_bwd - 3 * logits_gemm - 2 * ce;
      }
      fwd[r][ch] = f;
      bwd[r][ch] = b;
      bwd_w[r][ch] = w;
      bwd_i[r][ch] = b - w + exposed;
      pure[r][ch] = compute;
    }
  }
  StepTime out;
  out.p2p = pp > 1 ? CollectiveSeconds(hw, CollectiveKind::kSendRecv,
                                       c.sequence_parallel ? xf / t : xf, 2, x.pp_inter)
                   : 0;
  pipeline::ScheduleOptions so;
  so.kind = c.pipeline_schedule;
  so.pp = pp;
  so.vp = vp;
  so.micro_batches = static_cast<int>(c.num_micro_batches);
  absl::StatusOr<pipeline::Schedule> schedule = pipeline::BuildSchedule(so);
  if (!schedule.ok()) return schedule.status();
  pipeline::SimOptions sim;
  sim.comm_mode = pipeline::CommMode::kEager;
  const double p2p = out.p2p;
  sim.cost = [&](int r, const pipeline::Action& a) -> double {
    switch (a.kind) {
      case pipeline::ActionKind::kForward: return fwd[r][a.chunk];
      case pipeline::ActionKind::kBackward: return bwd[r][a.chunk];
      case pipeline::ActionKind::kBackwardInput: return bwd_i[r][a.chunk];
      case pipeline::ActionKind::kBackwardWeight: return bwd_w[r][a.chunk];
      default: return p2p;
    }
  };
  absl::StatusOr<pipeline::SimResult> result = pipeline::Simulate(*schedule, sim);
  if (!result.ok()) return result.status();
  out.makespan = result->makespan;
  out.bubble_fraction = result->bubble_fraction;
  double busiest_compute = 0;
  int busiest = 0;
  for (int r = 0; r < pp; ++r) {
    out.in_flight.push_back(result->stages[r].peak_activations);
    if (result->stages[r].busy >= result->stages[busiest].busy) busiest = r;
  }
  for (int ch = 0; ch < vp; ++ch) {
    busiest_compute += pure[busiest][ch] * c.num_micro_batches;
    out.terms += Scaled(pure_terms[busiest][ch], static_cast<double>(c.num_micro_batches));
  }

  // Data parallelism over the gradient group DP·CP, f32 gradients; with
  // --num-distributed-optimizer-instances N the strategy's collectives run
  // within an instance of DP·CP / N ranks (and the replicas' all-reduce below).
  const double instances = c.optimizer.distributed ? c.num_distributed_optimizer_instances : 1;
  const double group = static_cast<double>(dp) * cp / instances;
  // The largest stage's local parameters: what it reduces and updates.
  double params = 0;
  for (int r = 0; r < pp; ++r) params = std::max(params, static_cast<double>(StageParameters(c, r)));
  const double grad_bytes = options.grad_reduce_bytes * params;
  // The strategy's collectives span nodes when the instance does (hybrid
  // sharding keeps an instance of up to a node's ranks on its fast links).
  const bool dp_inter = tp * group > dpn || (cp > 1 && x.cp_inter);
  // Ranks of the gradient group (DP·CP) on one node: TP's ranks fill a node first.
  const int dp_per_node = std::max(1, std::min(static_cast<int>(group), dpn / std::max(1, tp)));
  // One collective per layer (GradientSync's bucket), each with its latency.
  auto reduce_of = [&](double share) {
    if (group <= 1) return 0.0;
    return CollectiveSeconds(hw,
                             c.optimizer.distributed ? CollectiveKind::kReduceScatter
                                                     : CollectiveKind::kAllReduce,
                             grad_bytes * share, group, dp_inter, dp_per_node);
  };
  auto gather_of = [&](double share) {
    if (group <= 1 || !c.optimizer.distributed) return 0.0;
    return CollectiveSeconds(hw, CollectiveKind::kAllGather,
                             options.param_gather_bytes * params * share, group, dp_inter,
                             dp_per_node);
  };
  double reduce = 0, gather = 0;
  // Overlap, read off the simulated timeline of the busiest stage, at the
  // granularity of GradientSync's buckets: whole layers (distributed/
  // gradient_sync.h), each chunk's parameters spread evenly over its layers.
  // --overlap-grad-reduce: a layer's reduction may start when the chunk's last
  // backward (micro-batch M − 1) has passed it (backward runs the layers in
  // reverse, at an even pace); reductions run one after the other; what runs
  // past the makespan is exposed. --overlap-param-gather: a layer's gather
  // must finish before the chunk's first forward (micro-batch 0) reaches it;
  // gathers run one after the other from the start of the step; the largest
  // lateness is exposed. Without the overlaps all of it is exposed.
  struct Span {
    double start = 1e300, end = 0;
  };
  std::vector<Span> last_backward(vp), first_forward(vp);
  for (const pipeline::TimedAction& a : result->stages[busiest].actions) {
    const int ch = a.action.chunk;
    // The weight gradients land at a full backward, or at W under a split one (zb-h1, the V).
    const bool writes_grads = a.action.kind == pipeline::ActionKind::kBackward ||
                              a.action.kind == pipeline::ActionKind::kBackwardWeight;
    if (writes_grads && a.end >= last_backward[ch].end) {
      last_backward[ch] = {a.start, a.end};
    } else if (a.action.kind == pipeline::ActionKind::kForward &&
               a.start < first_forward[ch].start) {
      first_forward[ch] = {a.start, a.end};
    }
  }
  struct Piece {
    double at;       // ready (reduce) or needed (gather), seconds into the step
    double seconds;  // its collective
  };
  std::vector<Piece> reduces, gathers;
  for (int ch = 0; ch < vp; ++ch) {
    auto range = pipeline::LayersOf(static_cast<int>(m.num_layers), pp, vp, busiest, ch);
    if (!range.ok()) return range.status();
    const int n = std::max(1, range->end() - range->first);
    const Span& b = last_backward[ch];
    const Span& f = first_forward[ch];
    const double share = 1.0 / vp / n;
    const double r = reduce_of(share), g = gather_of(share);
    for (int i = 0; i < n; ++i) {
      reduces.push_back({b.start + (i + 1) * (b.end - b.start) / n, r});
      gathers.push_back({f.start + i * (f.end - f.start) / n, g});
      reduce += r;
      gather += g;
    }
  }
  // Of that, the latencies (ring steps included): the same pieces of no bytes.
  out.dp_latency =
      static_cast<double>(reduces.size()) * (reduce_of(1e-30) + gather_of(1e-30));
  auto by_time = [](const Piece& a, const Piece& b) { return a.at < b.at; };
  // Hybrid sharding: each bucket's shard is then all-reduced over the N
  // instances, as soon as its reduction within the instance is done
  // (GradientSync::StartReplicaReductions), one after the other on the
  // replicas' links. Instances are consecutive ranks, so the replicas share
  // a node only when an instance is smaller than one.
  double replica_reduce = 0;
  const int group_on_node = std::min(dp * cp, dpn / std::max(1, tp));  // DP·CP ranks on a node
  const int per_node = std::max(1, group_on_node / static_cast<int>(group));  // replicas on a node
  auto replica_of = [&](double share) {
    if (instances <= 1) return 0.0;
    return CollectiveSeconds(hw, CollectiveKind::kAllReduce, grad_bytes * share / group,
                             static_cast<int>(instances), x.dp_inter && instances > per_node,
                             per_node);
  };
  double dp_exposed = 0;
  if (c.overlap_grad_reduce) {
    std::stable_sort(reduces.begin(), reduces.end(), by_time);
    const double share = 1.0 / static_cast<double>(std::max<size_t>(1, reduces.size()));
    const double replica_per_bucket = replica_of(share);
    double busy_until = 0, replicas_until = 0;
    for (const Piece& r : reduces) {
      busy_until = std::max(busy_until, r.at) + r.seconds;
      replicas_until = std::max(replicas_until, busy_until) + replica_per_bucket;
      replica_reduce += replica_per_bucket;
    }
    dp_exposed += std::max(0.0, std::max(busy_until, replicas_until) - result->makespan);
  } else {
    replica_reduce = replica_of(1.0);
    dp_exposed += reduce + replica_reduce;
  }
  // ZeRO-2 (optim_grads) reduce-scatters every bucket in each of the M
  // micro-batches, not only the last: the M - 1 earlier rounds run behind
  // the later micro-batches' backwards with --overlap-grad-reduce, and are
  // exposed without it.
  if (c.optimizer.shard_gradients && group > 1) {
    const double earlier = (static_cast<double>(c.num_micro_batches) - 1) * reduce;
    reduce += earlier;
    if (!c.overlap_grad_reduce) dp_exposed += earlier;
  }
  if (c.optimizer.shard_params && group > 1) {
    // ZeRO-3 (optim_grads_params): no gather after the step; every layer's parameters are
    // all-gathered before its forward and again before its backward, in each of the M
    // micro-batches (and for a recomputed forward too). With --overlap-param-gather the next
    // layer's gather runs behind the current layer's compute: per layer max(0, g − compute)
    // exposed, plus the step's first layer's gather (each later pass starts with the unit the
    // one before ended with, kept: GradientSync's prefetch across passes); without it, all.
    const double m = static_cast<double>(c.num_micro_batches);
    const double layers = std::max(1.0, static_cast<double>(gathers.size()));
    const double g = gather / layers;  // one layer's gather (its share of the stage)
    const double f = fwd[busiest][0] * vp / layers, b = bwd[busiest][0] * vp / layers;
    const double passes = m * (c.model.recompute_full() ? 3 : 2);
    gather = passes * gather;
    dp_exposed += c.overlap_param_gather
                      ? m * layers * (std::max(0.0, g - f) + std::max(0.0, g - b)) + g
                      : gather;
  } else if (c.overlap_param_gather) {
    std::stable_sort(gathers.begin(), gathers.end(), by_time);
    double done = 0, late = 0;
    for (const Piece& g : gathers) {
      done += g.seconds;
      late = std::max(late, done - g.at);
    }
    dp_exposed += late;
  } else {
    dp_exposed += gather;
  }
  reduce += replica_reduce;
  out.dp_comm = reduce + gather;
  out.dp_gather = gather;
  out.dp_exposed = dp_exposed;
  // Adam: read master, grad, m, v; write master, m, v, and the compute copy.
  const double owned = c.optimizer.distributed ? params / group : params;
  out.optimizer = OptimizerSeconds(hw, owned * (7 * 4 + x.e), x.ranks_on_node);

  out.forward_chunk = fwd[busiest][0];
  out.backward_chunk = bwd[busiest][0];
  out.tp_exposed_per_layer = dense.fwd_comm + dense.bwd_comm;
  out.tp_overlap_cost_per_layer = dense.tp_overlap_cost;
  out.compute = busiest_compute + out.optimizer;
  out.terms.optimizer = out.optimizer;
  out.bubble = result->makespan - result->ideal;
  out.exposed_comm = (result->ideal - busiest_compute) + dp_exposed;
  out.step = out.compute + out.exposed_comm + out.bubble;
  out.model_flops_per_step = ModelFlopsPerStep(c);
  const double tokens = static_cast<double>(c.global_batch_size) * m.seq_length;
  out.tokens_per_s = tokens / out.step;
  const double share = hw.ranks_share_compute() ? x.ranks_on_node : 1;
  out.mfu = out.model_flops_per_step / (out.step * c.world_size * hw.peak_flops() / share);
  return out;
}

std::string ExplainTime(const train::TrainConfig& c, const Hardware& hw, const StepTime& t) {
  std::string s = absl::StrFormat(
      "time, seconds (hardware %s: peak %.3g FLOP/s, memory %.3g B/s):\n"
      "  per chunk and micro-batch on the busiest stage: forward f = %.6f, backward b = %.6f\n"
      "    (GEMMs 2mnk / (peak x eff(2mnk)), attention, element-wise, exposed TP %.6f per layer)\n"
      "    (--tp-comm-overlap: chunked GEMMs on fewer SMs add %.6f per layer)\n"
      "  pipeline::Simulate(%s, P = %d, v = %d, M = %lld, p2p %.6f per transfer):\n"
      "    makespan %.6f, ideal %.6f, bubble fraction %.4f\n"
      "  DP over DP x CP = %d: reduce%s %.6f (latencies %.6f, one per layer), exposed %.6f%s\n"
      "  optimizer (Adam, 7 x 4 + e B per owned element at the optimizer's bandwidth) %.6f\n"
      "  step = compute %.6f + exposed communication %.6f + bubble %.6f = %.6f\n"
      "  model FLOPs per step (6N + 12 L h s per token) %.4g; tokens/s %.1f; MFU %.1f%%\n",
      hw.name(), hw.peak_flops(), hw.memory_bandwidth(), t.forward_chunk, t.backward_chunk,
      t.tp_exposed_per_layer, t.tp_overlap_cost_per_layer, pipeline::ScheduleKindName(c.pipeline_schedule),
      c.pipeline_model_parallel_size,
      c.virtual_pipeline_size, static_cast<long long>(c.num_micro_batches), t.p2p, t.makespan,
      t.makespan - t.bubble, t.bubble_fraction, c.data_parallel_size * c.context_parallel_size,
      c.optimizer.distributed ? "-scatter + all-gather" : " (all-reduce)", t.dp_comm,
      t.dp_latency, t.dp_exposed, c.overlap_grad_reduce ? " (--overlap-grad-reduce)" : "", t.optimizer,
      t.compute, t.exposed_comm, t.bubble, t.step, t.model_flops_per_step, t.tokens_per_s,
      100 * t.mfu);
  return s;
}

}  // namespace loom::plan
