#include "plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/ops/kernel_choice.h"
#include "models/gpt/gpt_config.h"
#include "pipeline/layer_assignment.h"
#include "pipeline/schedule.h"

namespace loom::plan {
namespace {

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t LocalPadded(const std::vector<layers::ParamSpec>& specs, int tp, int64_t multiple) {
  int64_t total = 0;
  for (const layers::ParamSpec& s : specs) {
    int64_t n = s.global_shape.numel();
    if (s.split != layers::TpSplit::kReplicated) n /= tp;
    total += RoundUp(n, multiple);
  }
  return total;
}

pipeline::ScheduleOptions ScheduleOf(const train::TrainConfig& c) {
  pipeline::ScheduleOptions o;
  o.kind = c.pipeline_schedule;
  o.pp = c.pipeline_model_parallel_size;
  o.vp = c.virtual_pipeline_size;
  o.micro_batches = static_cast<int>(c.num_micro_batches);
  return o;
}

// Activation terms of one micro-batch on one rank, bytes.
struct ActTerms {
  double x_full = 0;   // X: hidden state [s/c, b, h] in the compute dtype
  double x_seq = 0;    // Xs: X, or X/t under SP
  double layer = 0;    // K_layer (dense layer)
  double moe_layer = 0;
  double lse = 0;      // P: what the attention kernel keeps (lse, or s x s probs)
  double logits = 0;   // [s/c, b, V/t] f32
  double stats = 0;    // per-token f32 vector [s/c, b] (times 1/t under SP where split)
  // zb-h1: what a record waiting for its W keeps besides its forward's
  // (layers/weight_grad_store.h): each linear's output gradient, under SP the
  // column-parallel layers' gathered inputs, under full recomputation the
  // rerun forward's linear inputs; per dense / MoE layer.
  double stash_layer = 0, stash_moe_layer = 0;
};

// What the attention kernel keeps for its backward per layer: each row's
// log-sum-exp (f32), or, where the kernel manifest runs the s x s kernel on
// this device (CUDA until a device run proves another: core/ops/
// kernel_manifest.textproto), its probabilities [b, heads/t, s, s] in the
// compute dtype. The CP ring always keeps the lse.
double AttentionKept(const train::TrainConfig& c, double b, double heads, double s, double e) {
  const core::DeviceType device =
      c.device == train::DeviceKind::kCuda ? core::DeviceType::kCUDA : core::DeviceType::kCPU;
  const absl::StatusOr<core::ops::KernelChoice> choice = core::ops::ChooseKernel("attention", device);
  const bool probs = c.context_parallel_size == 1 && choice.ok() && choice->implementation == "sxs";
  return probs ? b * heads * s * s * e : b * heads * s * 4;
}

ActTerms Terms(const train::TrainConfig& c) {
  const layers::GptConfig& m = c.model;
  const double t = c.tensor_model_parallel_size, cp = c.context_parallel_size;
  const bool sp = c.sequence_parallel;
  const double e = c.bf16 ? 2 : 4;
  const double s = static_cast<double>(m.seq_length) / cp, b = c.micro_batch_size;
  const double h = m.hidden_size;
  ActTerms a;
  a.x_full = s * b * h * e;
  a.x_seq = sp ? a.x_full / t : a.x_full;
  a.stats = s * b * 4;
  a.lse = AttentionKept(c, b, m.num_attention_heads / t, s, e);
  const double heads = m.num_attention_heads, groups = m.query_groups();
  const double ffn = static_cast<double>(m.ffn()) / h;
  // qkv, core output; RoPE keeps q and k rotated (the kernel's per-head layout).
  const double attn_split =
      (heads + 2 * groups) / heads + 1 + (m.rope() ? (heads + groups) / heads : 0);
  const double mlp_split = (m.swiglu ? 3 : 2) * ffn;           // up (+gate), activation
  const double ln = 4 * a.stats / (sp ? t : 1);                // two LayerNorms' mean, rstd
  auto layer = [&](double mlp) {
    return sp ? (4 + attn_split + mlp) * a.x_full / t + ln + a.lse
              : 4 * a.x_full + (attn_split + mlp) * a.x_full / t + ln + a.lse;
  };
  a.layer = layer(mlp_split);
  // An MoE layer also keeps the routed copies of its tokens (dispatched
  // input, expert output, the permutations: 4·k hidden states of its own
  // tokens) and, under EP, the rows exchanged with the other EP ranks
  // (6·k·(EP − 1)/EP; fitted on plan_memory_model_test, where routing is uneven).
  const double k = static_cast<double>(m.moe_router_topk), ep = c.expert_model_parallel_size;
  a.moe_layer = layer(mlp_split * k) + k * a.x_seq * (4 + 6 * (ep - 1) / ep);
  const double up = (m.swiglu ? 2 : 1) * ffn;  // FC1's output width / h
  auto stash = [&](double mlp_rows) {
    double n = a.x_full * ((heads + 2 * groups) / heads / t + 1) +   // dY of QKV, projection
               mlp_rows * a.x_full * (up / t + 1);                    // dY of FC1, FC2
    if (sp) n += (1 + mlp_rows) * a.x_full;                           // gathered QKV, FC1 inputs
    if (m.recompute_full()) {
      n += (1 + mlp_rows * ffn) * a.x_full / t + (sp ? 0 : (1 + mlp_rows) * a.x_full);
    }
    return n;
  };
  a.stash_layer = stash(1);
  a.stash_moe_layer = stash(k);
  const double vocab = static_cast<double>(
      layers::EmbeddingParamSpecs(m, c.tensor_model_parallel_size)[0].global_shape.dim(0));
  a.logits = s * b * (vocab / t) * 4;
  return a;
}

// Kept bytes of one chunk for one micro-batch, and what its backward reruns
// at once (R).
void ChunkKept(const train::TrainConfig& c, const ActTerms& a, int first, int count,
               double* kept, double* rerun) {
  const layers::GptConfig& m = c.model;
  auto layer = [&](int l) { return m.moe_layer(l) ? a.moe_layer : a.layer; };
  double all = 0, max_layer = 0;
  for (int l = first; l < first + count; ++l) {
    all += layer(l);
    max_layer = std::max(max_layer, layer(l));
  }
  *kept = a.x_seq + all;
  *rerun = 0;
  if (m.recompute_selective()) {
    *kept -= count * a.lse;
    *rerun = a.lse;
  } else if (m.recompute_full()) {
    const int64_t n = std::max<int64_t>(1, m.recompute_num_layers);
    if (m.recompute_method == layers::RecomputeMethod::kBlock) {
      double rest = 0;
      for (int l = first + static_cast<int>(std::min<int64_t>(n, count)); l < first + count; ++l) {
        rest += layer(l);
      }
      *kept = a.x_seq + std::min<int64_t>(n, count) * a.x_seq + rest;
      *rerun = max_layer - a.x_seq;
    } else {
      const int64_t groups = (count + n - 1) / n;
      *kept = a.x_seq + groups * a.x_seq;
      *rerun = std::min<int64_t>(n, count) * max_layer - a.x_seq;
    }
  }
}

// Whether stage `pp_rank` holds the first virtual stage (the embedding) or the
// last (the head and the loss): stages 0 and P - 1, or stage 0 both in the V
// of zbv and dualpipev.
bool HoldsFirst(const train::TrainConfig& c, int pp_rank) {
  return pipeline::PlacementOf(ScheduleOf(c), 0).pp_rank == pp_rank;
}
bool HoldsLast(const train::TrainConfig& c, int pp_rank) {
  const pipeline::ScheduleOptions o = ScheduleOf(c);
  return pipeline::PlacementOf(o, o.pp * o.vp - 1).pp_rank == pp_rank;
}

// How many of pipeline stage `pp_rank`'s layers (over all its chunks) are MoE
// layers and how many dense.
struct StageLayers {
  int64_t moe = 0, dense = 0;
};
StageLayers LayersOfStage(const train::TrainConfig& c, int pp_rank) {
  const int vp = c.virtual_pipeline_size;
  StageLayers n;
  for (int chunk = 0; chunk < vp; ++chunk) {
    auto range = pipeline::ChunkLayers(ScheduleOf(c), static_cast<int>(c.model.num_layers),
                                       pp_rank, chunk);
    if (!range.ok()) continue;
    for (int l = range->first; l < range->end(); ++l) ++(c.model.moe_layer(l) ? n.moe : n.dense);
  }
  return n;
}

// GradientSync's buckets (distributed/gradient_sync.cc) on stage `pp_rank`'s
// units in buffer order: whole segments from the back up to
// --ddp-bucket-size, a bigger segment a bucket of its own, a word embedding
// tied across stages a bucket alone. Units are numbered in forward order
// (the backward runs them in reverse); each bucket lists the units that read
// and write it (the head reads the table the embedding owns at PP 1 and in
// the V: a guest of that bucket).
struct StageBucket {
  int64_t len;
  bool alone;
  std::vector<int> units;   // sorted
  std::vector<int> guests;  // units that write it but own none of its slots
};
std::vector<StageBucket> StageBuckets(const train::TrainConfig& c, int pp_rank, int* num_units) {
  const layers::GptConfig& m = c.model;
  const int tp = c.tensor_model_parallel_size;
  const int64_t multiple = static_cast<int64_t>(c.data_parallel_size) * c.context_parallel_size;
  const bool first = HoldsFirst(c, pp_rank), last = HoldsLast(c, pp_rank);
  // A tied table on two stages (not at PP 1, nor in the V, whose stage 0 holds both ends).
  const bool tied_across = m.tied_output_layer() && !(first && last);
  std::vector<StageBucket> segments;  // one per unit (two for a table tied across stages)
  int unit = 0;
  const std::vector<layers::ParamSpec> embedding = layers::EmbeddingParamSpecs(m, tp);
  int word_segment = -1;
  if (first) {
    if (tied_across) {
      segments.push_back({LocalPadded({embedding[0]}, tp, multiple), true, {unit}, {}});
      if (embedding.size() > 1) {
        segments.push_back({LocalPadded({embedding.begin() + 1, embedding.end()}, tp, multiple),
                            false, {unit}, {}});
      }
    } else {
      word_segment = static_cast<int>(segments.size());
      segments.push_back({LocalPadded(embedding, tp, multiple), false, {unit}, {}});
    }
    ++unit;
  }
  for (int chunk = 0; chunk < c.virtual_pipeline_size; ++chunk) {
    auto range =
        pipeline::ChunkLayers(ScheduleOf(c), static_cast<int>(m.num_layers), pp_rank, chunk);
    if (!range.ok()) continue;
    for (int l = range->first; l < range->end(); ++l, ++unit) {
      const layers::ExpertShard shard{0, m.moe_layer(l) ? c.expert_model_parallel_size : 1};
      segments.push_back(
          {LocalPadded(layers::BlockParamSpecs(m, l, shard), tp, multiple), false, {unit}, {}});
    }
  }
  if (last) {
    std::vector<layers::ParamSpec> head = layers::FinalNormParamSpecs(m);
    if (!m.tied_output_layer()) {
      for (const layers::ParamSpec& s : layers::OutputLayerParamSpecs(m, tp)) head.push_back(s);
    }
    segments.push_back({LocalPadded(head, tp, multiple), false, {unit}, {}});
    if (tied_across) {
      segments.push_back({LocalPadded({embedding[0]}, tp, multiple), true, {unit}, {}});
    }
    // At PP 1 (and in the V) the output layer reads the table the embedding owns.
    if (word_segment >= 0 && m.tied_output_layer()) {
      segments[word_segment].units.push_back(unit);
      segments[word_segment].guests.push_back(unit);
    }
    ++unit;
  }
  std::vector<StageBucket> buckets;  // from the back of the buffer
  const int64_t cap = std::max<int64_t>(1, c.optimizer.bucket_bytes / 4);
  for (size_t k = segments.size(); k-- > 0;) {
    const StageBucket& s = segments[k];
    if (!buckets.empty() && !buckets.back().alone && !s.alone &&
        buckets.back().len + s.len <= cap) {
      StageBucket& b = buckets.back();
      b.len += s.len;
      b.units.insert(b.units.end(), s.units.begin(), s.units.end());
      std::sort(b.units.begin(), b.units.end());
      b.guests.insert(b.guests.end(), s.guests.begin(), s.guests.end());
    } else {
      buckets.push_back(s);
    }
  }
  std::reverse(buckets.begin(), buckets.end());  // buffer order
  *num_units = unit;
  return buckets;
}

// One unit event of GradientSync's observer (layers/stage_model.h).
struct UnitEvent {
  enum Kind { kBeforeForward, kAfterForward, kBeforeBackward, kAfterBackward } kind;
  int unit;
};

// The unit events of one step on stage `pp_rank`, in order, as GptModel
// sends them (models/gpt/gpt_model.cc, Forward and BackwardChunk) for the
// schedule's action list (pipeline::ComputeOrder): a forward runs the
// embedding, the layers, the head; a backward the head, the layers in
// reverse (a recomputed run's BeforeBackwards all first), the embedding; a
// split backward sends the BeforeBackwards at I and the AfterBackwards, in
// the same order, at the deferred W.
std::vector<UnitEvent> StepEvents(const train::TrainConfig& c, int pp_rank, int micro_batches) {
  const layers::GptConfig& m = c.model;
  pipeline::ScheduleOptions o = ScheduleOf(c);
  o.micro_batches = micro_batches;
  const bool first = HoldsFirst(c, pp_rank);
  const int last_virtual = o.pp * o.vp - 1;
  struct Chunk {
    std::vector<UnitEvent> forward, whole, before, after;  // F; B; I's; W's
  };
  std::vector<Chunk> chunks;
  int unit = first ? 1 : 0;
  std::vector<int> first_unit;
  for (int chunk = 0; chunk < o.vp; ++chunk) {
    first_unit.push_back(unit);
    auto range = pipeline::ChunkLayers(o, static_cast<int>(m.num_layers), pp_rank, chunk);
    if (range.ok()) unit += range->count;
  }
  const int head = unit;
  // GptModel's runs (RecomputePlan): --recompute-num-layers layers under
  // full uniform recomputation, else one layer each.
  int per = 1;
  if (m.recompute_full() && m.recompute_method == layers::RecomputeMethod::kUniform) {
    per = static_cast<int>(std::max<int64_t>(1, m.recompute_num_layers));
  }
  for (int chunk = 0; chunk < o.vp; ++chunk) {
    Chunk ev;
    auto run = [&](int from, int count) {  // units [from, from + count), backward order
      for (int k = count; k-- > 0;) {
        ev.whole.push_back({UnitEvent::kBeforeBackward, from + k});
        ev.before.push_back({UnitEvent::kBeforeBackward, from + k});
      }
      for (int k = count; k-- > 0;) {
        ev.whole.push_back({UnitEvent::kAfterBackward, from + k});
        ev.after.push_back({UnitEvent::kAfterBackward, from + k});
      }
    };
    const int virtual_stage = pipeline::VirtualStageOf(o, pp_rank, chunk);
    auto range = pipeline::ChunkLayers(o, static_cast<int>(m.num_layers), pp_rank, chunk);
    const int n = range.ok() ? range->count : 0;
    auto forward = [&](int u) {
      ev.forward.push_back({UnitEvent::kBeforeForward, u});
      ev.forward.push_back({UnitEvent::kAfterForward, u});
    };
    if (virtual_stage == 0) forward(0);
    for (int i = 0; i < n; ++i) forward(first_unit[chunk] + i);
    if (virtual_stage == last_virtual) forward(head);
    if (virtual_stage == last_virtual) run(head, 1);
    for (int i = (n - 1) / per * per; n > 0 && i >= 0; i -= per) {
      run(first_unit[chunk] + i, std::min(per, n - i));
    }
    if (virtual_stage == 0) run(0, 1);
    chunks.push_back(std::move(ev));
  }
  std::vector<UnitEvent> events;
  for (const pipeline::Action& a : pipeline::ComputeOrder(o, pp_rank)) {
    const Chunk& ev = chunks[a.chunk];
    if (a.kind == pipeline::ActionKind::kForward) {
      events.insert(events.end(), ev.forward.begin(), ev.forward.end());
    } else if (a.kind == pipeline::ActionKind::kBackward) {
      events.insert(events.end(), ev.whole.begin(), ev.whole.end());
    } else if (a.kind == pipeline::ActionKind::kBackwardInput) {
      events.insert(events.end(), ev.before.begin(), ev.before.end());
    } else if (a.kind == pipeline::ActionKind::kBackwardWeight) {
      events.insert(events.end(), ev.after.begin(), ev.after.end());
    }
  }
  return events;
}
// Per unit, the buckets it reads and writes in its parameters' order (its
// own segments in buffer order, then the table it reads as a guest):
// GradientSync's unit_buckets().
std::vector<std::vector<int>> UnitBuckets(const std::vector<StageBucket>& buckets, int units) {
  std::vector<std::vector<int>> unit_buckets(units);
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (int u : buckets[b].units) {
      if (std::find(buckets[b].guests.begin(), buckets[b].guests.end(), u) ==
          buckets[b].guests.end()) {
        unit_buckets[u].push_back(static_cast<int>(b));
      }
    }
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (int u : buckets[b].guests) unit_buckets[u].push_back(static_cast<int>(b));
  }
  return unit_buckets;
}

// ZeRO-2's bucket buffers at their peak, in elements: GradientSync's pool
// (distributed/gradient_sync.cc, gradient_shard.cc) replayed over a step's
// backward events. A bucket is bound to a buffer at the BeforeBackward of a
// unit that writes it and reduce-scattered at an AfterBackward once every
// writer has run a backward since it was bound and none is still open (a
// split backward opens a unit at I and closes it at its deferred W, so the
// Ws of several micro-batches land in one binding); ZeRO-3 reduce-scatters a
// bucket whose writers are not neighbours (the tied table at PP 1 and in the
// V) after each writer instead. The pool keeps its buffers (the ledger's
// bytes are the buffers allocated): a bucket takes the buffer it had last,
// else the smallest free one it fits, else a new one while fewer than the
// buckets bound + 1 (+ 1 being reduce-scattered with --overlap-grad-reduce)
// exist, else the smallest free one reallocated. Steps repeat until the
// pool stops growing (the second step starts from the first's pool).
int64_t BucketPoolPeak(const train::TrainConfig& c, const std::vector<StageBucket>& buckets,
                       int units, const std::vector<UnitEvent>& events) {
  const int nb = static_cast<int>(buckets.size());
  const bool overlap = c.overlap_grad_reduce;
  const std::vector<std::vector<int>> unit_buckets = UnitBuckets(buckets, units);
  std::vector<bool> each(nb, false);
  for (int b = 0; b < nb; ++b) {
    const std::vector<int>& r = buckets[b].units;
    each[b] = c.optimizer.shard_params && r.back() - r.front() + 1 != static_cast<int>(r.size());
  }
  struct Buffer {
    int64_t len;
    bool free;
  };
  std::vector<Buffer> pool;
  int64_t bytes = 0, peak = 0;
  std::vector<int> bound(nb, -1), last(nb, -1);
  std::deque<int> in_flight;  // buffers being reduce-scattered, oldest first
  auto complete_oldest = [&] {
    pool[in_flight.front()].free = true;
    in_flight.pop_front();
  };
  auto bind = [&](int b) {
    int target = static_cast<int>(std::count_if(bound.begin(), bound.end(),
                                                [](int i) { return i >= 0; })) +
                 1 + (overlap ? 1 : 0);
    const int pref = last[b];
    while (pref >= 0 && std::find(in_flight.begin(), in_flight.end(), pref) != in_flight.end()) {
      complete_oldest();
    }
    auto has_free = [&] {
      return std::any_of(pool.begin(), pool.end(), [](const Buffer& x) { return x.free; });
    };
    while (!has_free() && static_cast<int>(pool.size()) >= target && !in_flight.empty()) {
      complete_oldest();
    }
    if (!has_free()) target = std::max(target, static_cast<int>(pool.size()) + 1);
    const int64_t len = buckets[b].len;
    int fit = -1, smallest = -1;
    if (pref >= 0 && pool[pref].free && pool[pref].len >= len) {
      fit = pref;
    } else {
      for (int i = 0; i < static_cast<int>(pool.size()); ++i) {
        if (!pool[i].free) continue;
        if (pool[i].len >= len && (fit < 0 || pool[i].len < pool[fit].len)) fit = i;
        if (smallest < 0 || pool[i].len < pool[smallest].len) smallest = i;
      }
    }
    if (fit < 0) {
      if (static_cast<int>(pool.size()) < target) {
        fit = static_cast<int>(pool.size());
        pool.push_back({0, true});
      } else {
        fit = smallest;  // released before its replacement is allocated
        bytes -= pool[fit].len;
      }
      pool[fit].len = len;
      bytes += len;
      peak = std::max(peak, bytes);
    }
    pool[fit].free = false;
    bound[b] = last[b] = fit;
  };
  std::vector<std::vector<int>> done(nb);  // per bucket, per writer: backwards since bound
  auto flush = [&](int b) {
    in_flight.push_back(bound[b]);
    bound[b] = -1;
    std::fill(done[b].begin(), done[b].end(), 0);
    if (!overlap) complete_oldest();
  };
  for (int step = 0; step < 4; ++step) {
    const int64_t before = peak;
    std::vector<int> open(units, 0);
    for (int b = 0; b < nb; ++b) done[b].assign(buckets[b].units.size(), 0);
    for (const UnitEvent& e : events) {
      if (e.kind == UnitEvent::kBeforeForward || e.kind == UnitEvent::kAfterForward) continue;
      if (e.kind == UnitEvent::kBeforeBackward) {
        ++open[e.unit];
        // The largest first (GradientSync::BeforeBackward).
        std::vector<int> order = unit_buckets[e.unit];
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return buckets[a].len > buckets[b].len; });
        for (int b : order) {
          if (bound[b] < 0) bind(b);
        }
        continue;
      }
      --open[e.unit];
      for (int b : unit_buckets[e.unit]) {
        const std::vector<int>& writers = buckets[b].units;
        ++done[b][std::find(writers.begin(), writers.end(), e.unit) - writers.begin()];
        const bool still_open =
            std::any_of(writers.begin(), writers.end(), [&](int w) { return open[w] > 0; });
        if (bound[b] >= 0 && !still_open &&
            (each[b] || std::find(done[b].begin(), done[b].end(), 0) == done[b].end())) {
          flush(b);
        }
      }
    }
    // FinishGradients: what is still bound, from the back; then every flush.
    for (int b = nb; b-- > 0;) {
      if (bound[b] >= 0) flush(b);
    }
    while (!in_flight.empty()) complete_oldest();
    if (step > 0 && peak == before) break;
  }
  return peak;
}

int64_t GatheredPeak(const train::TrainConfig& c, const std::vector<StageBucket>& buckets,
                     int units, const std::vector<UnitEvent>& events) {
  const std::vector<std::vector<int>> unit_buckets = UnitBuckets(buckets, units);
  // GradientSync's gathers (AcquireUnit, ReleaseUnit) replayed over the
  // step's unit events: a unit's buckets are gathered (f32) and bound (+ the
  // bf16 copy) from its BeforeForward or BeforeBackward to its AfterForward or
  // AfterBackward, so a split backward holds them from I to W and several
  // micro-batches' units at once; with --overlap-param-gather the next unit's
  // (the previous in a backward) are gathered ahead (f32 only until bound),
  // a released unit's kept for the next pass, and a prefetch not taken is
  // dropped when the next unit begins.
  struct Gathered {
    bool master = false, bound = false, prefetched = false;
    int holds = 0;
  };
  std::vector<Gathered> g(buckets.size());
  const int64_t copy = c.bf16 ? 2 : 0;
  int64_t bytes = 0, peak = 0;
  auto start = [&](int b) {
    if (g[b].master) return;
    g[b].master = true;
    bytes += 4 * buckets[b].len;
    peak = std::max(peak, bytes);
  };
  auto drop = [&](int b) {
    if (!g[b].master) return;
    bytes -= (4 + (g[b].bound ? copy : 0)) * buckets[b].len;
    g[b] = Gathered();
  };
  auto acquire = [&](int u, int prefetch) {
    for (int b : unit_buckets[u]) start(b);
    for (int b : unit_buckets[u]) {
      if (!g[b].bound) {
        g[b].bound = true;
        bytes += copy * buckets[b].len;
        peak = std::max(peak, bytes);
      }
      ++g[b].holds;
      g[b].prefetched = false;
    }
    for (size_t b = 0; b < g.size(); ++b) {
      if (g[b].prefetched && g[b].holds == 0) drop(static_cast<int>(b));
    }
    if (!c.overlap_param_gather || prefetch < 0) return;
    for (int b : unit_buckets[prefetch]) {
      start(b);
      g[b].prefetched = true;
    }
  };
  auto release = [&](int u) {
    for (int b : unit_buckets[u]) {
      if (--g[b].holds > 0 || g[b].prefetched) continue;
      if (c.overlap_param_gather) {
        g[b].prefetched = true;  // kept: the next pass may start with this unit
      } else {
        drop(b);
      }
    }
  };
  for (const UnitEvent& e : events) {
    switch (e.kind) {
      case UnitEvent::kBeforeForward: acquire(e.unit, e.unit + 1 < units ? e.unit + 1 : -1); break;
      case UnitEvent::kBeforeBackward: acquire(e.unit, e.unit - 1); break;
      case UnitEvent::kAfterForward:
      case UnitEvent::kAfterBackward: release(e.unit); break;
    }
  }
  return peak;
}

}  // namespace

int ReplayedMicroBatches(const train::TrainConfig& c) {
  return static_cast<int>(
      std::min<int64_t>(c.num_micro_batches, 4 * static_cast<int64_t>(c.pipeline_model_parallel_size)));
}

ReplayPeaks ReplayStep(const train::TrainConfig& c, int pp_rank, int micro_batches) {
  int units = 0;
  const std::vector<StageBucket> buckets = StageBuckets(c, pp_rank, &units);
  const std::vector<UnitEvent> events = StepEvents(c, pp_rank, micro_batches);
  ReplayPeaks p;
  if (c.optimizer.shard_gradients) p.bucket_pool_bytes = 4 * BucketPoolPeak(c, buckets, units, events);
  if (c.optimizer.shard_params) p.gathered_bytes = GatheredPeak(c, buckets, units, events);
  return p;
}

int64_t StageExpertParameters(const train::TrainConfig& c, int pp_rank) {
  const layers::GptConfig& m = c.model;
  if (!m.moe()) return 0;
  const int64_t multiple = static_cast<int64_t>(c.data_parallel_size) * c.context_parallel_size;
  std::vector<layers::ParamSpec> experts;
  for (const layers::ParamSpec& s :
       layers::BlockParamSpecs(m, 0, layers::ExpertShard{0, c.expert_model_parallel_size})) {
    if (s.expert) experts.push_back(s);
  }
  return LayersOfStage(c, pp_rank).moe *
         LocalPadded(experts, c.tensor_model_parallel_size, multiple);
}

int64_t StageParameters(const train::TrainConfig& c, int pp_rank) {
  const layers::GptConfig& m = c.model;
  const int tp = c.tensor_model_parallel_size;
  const int64_t multiple = static_cast<int64_t>(c.data_parallel_size) * c.context_parallel_size;
  const int ep = c.expert_model_parallel_size;
  // A dense block's specs from a dense layer (layer 0 is an MoE layer
  // whenever the model has experts: l % --moe-layer-freq == 0).
  int64_t dense_layer = 0;
  while (dense_layer + 1 < m.num_layers && m.moe_layer(dense_layer)) ++dense_layer;
  const int64_t dense = LocalPadded(layers::BlockParamSpecs(m, dense_layer), tp, multiple);
  int64_t moe = dense;
  if (m.moe()) {
    moe = LocalPadded(layers::BlockParamSpecs(m, 0, layers::ExpertShard{0, ep}), tp, multiple);
  }
  const StageLayers stage = LayersOfStage(c, pp_rank);
  int64_t total = stage.moe * moe + stage.dense * dense;
  const bool first = HoldsFirst(c, pp_rank), last = HoldsLast(c, pp_rank);
  const std::vector<layers::ParamSpec> embedding = layers::EmbeddingParamSpecs(m, tp);
  if (first) total += LocalPadded(embedding, tp, multiple);
  if (last) {
    total += LocalPadded(layers::FinalNormParamSpecs(m), tp, multiple);
    if (m.tied_output_layer()) {
      if (!first) total += LocalPadded({embedding[0]}, tp, multiple);
    } else {
      total += LocalPadded(layers::OutputLayerParamSpecs(m, tp), tp, multiple);
    }
  }
  return total;
}

std::vector<StageMemory> PredictMemory(const train::TrainConfig& c,
                                       const std::vector<int>& in_flight) {
  const int pp = c.pipeline_model_parallel_size, vp = c.virtual_pipeline_size;
  const pipeline::ScheduleOptions schedule = ScheduleOf(c);
  const ActTerms a = Terms(c);
  const double t = c.tensor_model_parallel_size;
  const double group = static_cast<double>(c.data_parallel_size) * c.context_parallel_size;
  // What the strategy shards is sharded over an instance of the group
  // (--num-distributed-optimizer-instances: DP x CP / N ranks; N = 1: all).
  const double shard = group / c.num_distributed_optimizer_instances;
  std::vector<StageMemory> stages(pp);
  for (int r = 0; r < pp; ++r) {
    StageMemory& st = stages[r];
    st.pp_rank = r;
    // Records held at the peak (zb-h1: also those waiting for their W).
    st.in_flight = r < static_cast<int>(in_flight.size())
                       ? in_flight[r]
                       : pipeline::PeakInFlightActivations(schedule, r);
    const double n = static_cast<double>(StageParameters(c, r));
    MemoryBreakdown& m = st.bytes;
    m.parameters = 4 * n + (c.bf16 ? 2 * n : 0);
    // Adam's m and v; when the gradient norm is split over ranks (TP, PP or
    // ZeRO-1 shards, experts over EP), the f64 scalar it is all-reduced in.
    const bool split_norm = t * pp > 1 || c.expert_model_parallel_size > 1 ||
                            (c.optimizer.distributed && shard > 1);
    // ZeRO-1 shards the experts over their replicas (DP / EP x CP), the rest
    // over DP x CP; both within an instance.
    const double experts = static_cast<double>(StageExpertParameters(c, r));
    const double owned = (n - experts) / shard + experts / (shard / c.expert_model_parallel_size);
    const double adam = c.optimizer.distributed ? 8 * owned : 8 * n;
    // ZeRO-2 keeps the owned shard and the bucket pool (ReplayStep).
    m.gradients = 4 * n;
    const ReplayPeaks replay = c.optimizer.shard_gradients
                                   ? ReplayStep(c, r, ReplayedMicroBatches(c))
                                   : ReplayPeaks();
    if (c.optimizer.shard_gradients) {
      m.gradients = 4 * owned + static_cast<double>(replay.bucket_pool_bytes);
    }
    m.optimizer = adam + (split_norm ? 8 : 0);
    // ZeRO-3 keeps the owned f32 values only; the gathered units' whole
    // buckets (f32, and their bf16 copy) are transient communication.
    double gathered = 0;
    if (c.optimizer.shard_params) {
      m.parameters = 4 * owned;
      gathered = static_cast<double>(replay.gathered_bytes);
    }
    // Activations: the average chunk's kept bytes times the chunks in flight.
    double kept_sum = 0, rerun = 0;
    for (int chunk = 0; chunk < vp; ++chunk) {
      auto range = pipeline::ChunkLayers(schedule, static_cast<int>(c.model.num_layers), r, chunk);
      if (!range.ok()) continue;
      double k = 0, rr = 0;
      ChunkKept(c, a, range->first, range->count, &k, &rr);
      kept_sum += k;
      rerun = std::max(rerun, rr);
    }
    const double kept_chunk = kept_sum / vp;
    // zb-h1: stage r defers W(m) until I(m + r): at the peak the record whose
    // I has just run and the r before it hold their whole stash.
    double stash_chunk = 0;
    if (schedule.kind == pipeline::ScheduleKind::kZBH1) {
      auto range = pipeline::LayersOf(static_cast<int>(c.model.num_layers), pp, 1, r, 0);
      if (range.ok()) {
        for (int l = range->first; l < range->end(); ++l) {
          stash_chunk += c.model.moe_layer(l) ? a.stash_moe_layer : a.stash_layer;
        }
      }
      if (r == pp - 1) stash_chunk += a.logits;  // the output layer's dY
      stash_chunk *= std::min<double>(r + 1, static_cast<double>(c.num_micro_batches));
    }
    const bool last = HoldsLast(c, r);
    const double head_kept = a.x_seq + 2 * a.stats / (c.sequence_parallel ? t : 1) + a.logits +
                             3 * a.stats;
    // zb-h1's last stage keeps its records (their logits) until their W.
    const double heads_in_flight =
        c.pipeline_schedule == pipeline::ScheduleKind::kGPipe ? static_cast<double>(c.num_micro_batches)
        : c.pipeline_schedule == pipeline::ScheduleKind::kZBH1 ? static_cast<double>(st.in_flight)
                                                               : 1.0;
    const double working = 2 * a.x_full + a.x_seq + 4 * a.x_full / t + (last ? a.logits : 0);
    m.activations = st.in_flight * kept_chunk + (last ? heads_in_flight * head_kept : 0) +
                    working + rerun + stash_chunk;
    // Communication staging: a DP bucket while it is reduced; the SP gathers
    // and TP reductions stage one hidden state.
    double comm = 0;
    // A DP bucket: ZeRO-1 stages the whole bucket (reduce-scatter, all-gather),
    // the all-reduce its (g - 1)/g ring share.
    if (group > 1) {
      // On the CPU the host engine (comm/internal/engine.cc: the local, UCX
      // and MPI backends) keeps a staging buffer as large as the largest
      // collective: the largest bucket (whole units; a unit above
      // --ddp-bucket-size is a bucket of its own). On CUDA (NCCL, whose
      // staging no run has measured) a bucket of at most --ddp-bucket-size.
      double bucket = std::min<double>(c.optimizer.bucket_bytes, m.gradients);
      if (c.device == train::DeviceKind::kCpu) {
        int units = 0;
        int64_t largest = 0;
        for (const StageBucket& b : StageBuckets(c, r, &units)) largest = std::max(largest, b.len);
        bucket = 4.0 * static_cast<double>(largest);
      }
      comm += c.optimizer.distributed ? bucket : bucket * (group - 1) / group;
    }
    if (t > 1) comm += a.x_full;
    m.communication = comm + gathered;
  }
  return stages;
}

StageMemory PeakMemory(const std::vector<StageMemory>& stages) {
  StageMemory best;
  double most = -1;
  for (const StageMemory& s : stages) {
    if (s.bytes.total() > most) {
      most = s.bytes.total();
      best = s;
    }
  }
  return best;
}

std::string ExplainMemory(const train::TrainConfig& c, const StageMemory& st) {
  const ActTerms a = Terms(c);
  const double n = static_cast<double>(StageParameters(c, st.pp_rank));
  const double gib = 1024.0 * 1024 * 1024;
  std::string s = absl::StrFormat(
      "memory of pipeline stage %d (the largest), bytes:\n"
      "  n_pad = %.0f local parameter elements (slots padded to DP x CP = %d; sharded over "
      "DP x CP / N, N = --num-distributed-optimizer-instances = %d)\n"
      "  parameters    = 4 n_pad%s = %.3f GiB\n"
      "  gradients     = 4 n_pad%s = %.3f GiB\n"
      "  optimizer     = 8 n_pad%s = %.3f GiB\n",
      st.pp_rank, n, c.data_parallel_size * c.context_parallel_size,
      c.num_distributed_optimizer_instances,
      c.optimizer.shard_params ? " / (DP x CP / N) (optim_grads_params: the owned f32 shard; the "
                                 "gathered units are communication)"
      : c.bf16                 ? " + 2 n_pad"
                               : "",
      st.bytes.parameters / gib,
      c.optimizer.shard_gradients
          ? " / (DP x CP / N) + the bucket pool at its peak (optim_grads and optim_grads_params: GradientSync's buffers "
            "replayed over the step's backward events; a bucket bound from a writer's backward, "
            "or I, to the last writer's, or W, + one reduce-scattering with "
            "--overlap-grad-reduce)"
          : "",
      st.bytes.gradients / gib,
      !c.optimizer.distributed ? ""
      : c.expert_model_parallel_size > 1
          ? absl::StrFormat(
                " / %d, its %d expert elements / %d (DP / EP x CP / N)",
                c.data_parallel_size * c.context_parallel_size /
                    c.num_distributed_optimizer_instances,
                StageExpertParameters(c, st.pp_rank),
                c.data_parallel_size * c.context_parallel_size / c.expert_model_parallel_size /
                    c.num_distributed_optimizer_instances)
          : absl::StrCat(" / ", c.data_parallel_size * c.context_parallel_size /
                                     c.num_distributed_optimizer_instances),
      st.bytes.optimizer / gib);
  absl::StrAppendFormat(
      &s,
      "  X  = s/CP x b x h x e = %.0f B; Xs = %.0f B (SP: X / TP); attention's kept P = %.0f B "
      "(lse, or the s x s kernel's probabilities where it runs)\n"
      "  K_layer = %s = %.0f B\n"
      "  activations   = a K_chunk + K_head + W + R, a = %d chunk activations in flight "
      "(pipeline simulator) = %.3f GiB\n"
      "  communication = one DP bucket (the largest on the CPU) + one hidden state for TP%s = "
      "%.3f GiB\n"
      "  total         = %.3f GiB\n",
      a.x_full, a.x_seq, a.lse,
      c.sequence_parallel ? "16 X/TP + N/TP + P" : "(4 + 12/TP) X + N + P (GPT-2 shape)",
      a.layer, st.in_flight, st.bytes.activations / gib,
      c.optimizer.shard_params
          ? absl::StrFormat(" + the gathered parameters (%d B at once: the buckets of the units "
                            "between their before- and after-event%s)",
                            ReplayStep(c, st.pp_rank, ReplayedMicroBatches(c)).gathered_bytes,
                            c.overlap_param_gather ? " and the prefetched neighbour's" : "")
          : "",
      st.bytes.communication / gib,
      st.bytes.total() / gib);
  return s;
}

}  // namespace loom::plan
