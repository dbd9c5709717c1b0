#include "distributed/gradient_sync.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/memory_stats.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "layers/params.h"

namespace loom::distributed {

using core::Tensor;

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::StatusOr<Tensor> Slice(const Tensor& flat, const FlatRange& r) {
  return flat.Narrow(r.first, r.second - r.first);
}

// A run of consecutive parameters that one unit completes (or the tied word
// embedding, completed only by the embedding-group sum).
struct Segment {
  FlatRange range;
  int unit = -1;  // index into StageModel::units()
  bool tied = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradientSync>> GradientSync::Create(
    layers::StageModel* model, const GradientSyncGroups& groups, const GradientSyncOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("GradientSync: no model");
  if (options.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GradientSync: ", options.micro_batches, " micro-batches per step"));
  }
  if (options.overlap_param_gather && !options.distributed_optimizer) {
    return absl::InvalidArgumentError(
        "--overlap-param-gather needs --use-distributed-optimizer (without it every rank updates "
        "all parameters and nothing is gathered)");
  }
  if (options.shard_gradients && !options.distributed_optimizer) {
    return absl::InvalidArgumentError(
        "--data-parallel-sharding-strategy=optim_grads shards the optimizer state too: "
        "GradientSyncOptions::shard_gradients needs distributed_optimizer");
  }
  if (options.shard_params && !options.shard_gradients) {
    return absl::InvalidArgumentError(
        "--data-parallel-sharding-strategy=optim_grads_params shards the gradients too: "
        "GradientSyncOptions::shard_params needs shard_gradients");
  }
  if (options.shard_params && model->params().holds_values()) {
    return absl::InvalidArgumentError(
        "GradientSync: ZeRO-3 keeps the parameters' owned shard itself: build the model without "
        "value buffers (GptConfig::allocate_parameters = false)");
  }
  if (options.instances < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--num-distributed-optimizer-instances (",
                                                   options.instances, ") must be >= 1"));
  }
  std::unique_ptr<GradientSync> s(new GradientSync(model, groups, options));
  LOOM_RETURN_IF_ERROR(s->SplitInstances());
  LOOM_RETURN_IF_ERROR(s->Layout());
  if (options.shard_gradients) LOOM_RETURN_IF_ERROR(s->LayoutShard());
  if (options.shard_params) {
    LOOM_ASSIGN_OR_RETURN(ParamShard values, ParamShard::Create(s->owned_, model->params()));
    s->values_.emplace(std::move(values));
    s->gathered_.assign(s->buckets_.size(), {});
  }
  model->AddObserver(s.get());
  return s;
}

GradientSync::~GradientSync() {
  if (zero3()) DropAllGathered().IgnoreError();
  model_->RemoveObserver(this);
}

absl::Status GradientSync::SplitInstances() {
  const int n = options_.instances;
  if (n == 1) return absl::OkStatus();
  const int g = groups_.dp != nullptr ? groups_.dp->size() : 1;
  if (!options_.distributed_optimizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances=", n,
        " shards within instances: it needs a --data-parallel-sharding-strategy other than "
        "no_shard (or --use-distributed-optimizer)"));
  }
  if (g % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-distributed-optimizer-instances (", n,
                     ") does not divide the data-parallel group (", g, " ranks)"));
  }
  const int per = g / n, rank = groups_.dp->rank();
  const int ep = groups_.expert_parallel;
  if (expert_parallel() && per % ep != 0) {
    // An instance must hold whole EP groups: every expert, and the same
    // share of each expert's replicas as every other instance (the trainer
    // checks DP / N against EP; this is the part visible here).
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances (", n, "): an instance's ", per,
        " ranks cannot hold whole --expert-model-parallel-size (", ep, ") groups"));
  }
  // Instance i: the group's ranks [i g/N, (i+1) g/N); replicas: one rank of
  // each instance, the same rank within it. Split is collective over the group.
  instance_index_ = rank / per;
  LOOM_ASSIGN_OR_RETURN(instance_group_, groups_.dp->Split(instance_index_, rank, "dp_instance"));
  LOOM_ASSIGN_OR_RETURN(replicas_, groups_.dp->Split(rank % per, rank, "dp_replicas"));
  shard_dp_ = instance_group_.get();
  if (sharded_over(groups_.expert_dp)) {
    // The experts' replicas in this instance. Its k-th rank holds the same
    // experts as the k-th of every other instance, which is its replica in
    // replicas(): both walk the DP ranks in order, EP of them at a time.
    comm::Communicator& edp = *groups_.expert_dp;
    LOOM_ASSIGN_OR_RETURN(expert_instance_group_,
                          edp.Split(instance_index_, edp.rank(), "expert_dp_instance"));
    if (expert_instance_group_->size() * n != edp.size()) {
      return absl::InternalError(absl::StrCat(
          "GradientSync: ", expert_instance_group_->size(), " of the ", edp.size(),
          " expert-data-parallel ranks are in instance ", instance_index_, ", not 1 / ", n));
    }
  }
  return absl::OkStatus();
}

absl::Status GradientSync::Layout() {
  const layers::ParamBuffer& params = model_->params();
  const std::vector<layers::ParamUnit>& units = model_->units();
  const int n = static_cast<int>(params.params().size());
  // Untied (--untie-embeddings-and-output-weights), the first stage's word
  // embedding and the last stage's output layer are ordinary parameters.
  const bool tied = groups_.embedding != nullptr && groups_.embedding->size() > 1 &&
                    model_->word_embedding().valid() && model_->tied_word_embedding();

  // Each parameter is completed by the first unit (in forward order) that
  // lists it: the word embedding by the embedding, whose backward runs after
  // the head's for every micro-batch.
  std::vector<int> unit_of(n, -1);
  for (size_t u = 0; u < units.size(); ++u) {
    for (layers::ParamHandle h : units[u].params) {
      if (unit_of[h.index] < 0) unit_of[h.index] = static_cast<int>(u);
    }
  }
  std::vector<Segment> segments;
  for (int i = 0; i < n; ++i) {
    const layers::ParamHandle h{i};
    if (unit_of[i] < 0) {
      return absl::InternalError(absl::StrCat("GradientSync: parameter ",
                                              params.at(h).spec->name, " belongs to no unit"));
    }
    const bool is_tied = tied && h == model_->word_embedding();
    const FlatRange slot{params.at(h).offset, params.SlotEnd(h)};
    if (!segments.empty() && !is_tied && !segments.back().tied &&
        segments.back().unit == unit_of[i] && segments.back().range.second == slot.first) {
      segments.back().range.second = slot.second;
    } else {
      segments.push_back({slot, unit_of[i], is_tied});
    }
  }

  // Buckets of whole segments from the back of the buffer (where the
  // backward starts), each up to bucket_bytes; the tied embedding alone.
  const int64_t max_elements = std::max<int64_t>(1, options_.bucket_bytes / 4);
  std::vector<GradBucket> reversed;
  for (size_t k = segments.size(); k-- > 0;) {
    const Segment& seg = segments[k];
    const int64_t len = seg.range.second - seg.range.first;
    GradBucket* open = reversed.empty() ? nullptr : &reversed.back();
    const bool fits = open != nullptr && !open->tied_embedding && !seg.tied &&
                      open->range.first == seg.range.second &&
                      open->range.second - open->range.first + len <= max_elements;
    if (fits) {
      open->range.first = seg.range.first;
    } else {
      GradBucket bucket;
      bucket.range = seg.range;
      bucket.tied_embedding = seg.tied;
      reversed.push_back(std::move(bucket));
      open = &reversed.back();
    }
    if (std::find(open->units.begin(), open->units.end(), seg.unit) == open->units.end() &&
        !seg.tied) {
      open->units.push_back(seg.unit);
    }
  }
  buckets_.assign(reversed.rbegin(), reversed.rend());

  // Ownership: under ZeRO-1 slice `rank` of every part (its rank in the
  // part's group), else all of it.
  for (GradBucket& b : buckets_) {
    b.parts = Parts(b.range);
    for (BucketPart& part : b.parts) {
      comm::Communicator* group = sharded() ? GroupOf(part) : nullptr;
      const int size = group != nullptr ? group->size() : 1;
      const int rank = group != nullptr ? group->rank() : 0;
      const int64_t len = part.range.second - part.range.first;
      if (len % size != 0) {
        return absl::InternalError(absl::StrCat(
            "GradientSync: [", part.range.first, ", ", part.range.second, ") does not split into ",
            size, " equal shards: build the model with buffer_multiple = DP"));
      }
      part.owned = {part.range.first + rank * (len / size),
                    part.range.first + (rank + 1) * (len / size)};
      if (!owned_.empty() && owned_.back().second == part.owned.first) {
        owned_.back().second = part.owned.second;
      } else if (part.owned.second > part.owned.first) {
        owned_.push_back(part.owned);
      }
    }
  }

  // Which bucket each unit completes, and which buckets each unit reads.
  unit_bucket_.assign(units.size(), -1);
  unit_buckets_.assign(units.size(), {});
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int64_t u : buckets_[b].units) unit_bucket_[u] = static_cast<int>(b);
  }
  for (size_t u = 0; u < units.size(); ++u) {
    for (layers::ParamHandle h : units[u].params) {
      const int64_t at = params.at(h).offset;
      for (size_t b = 0; b < buckets_.size(); ++b) {
        if (at >= buckets_[b].range.first && at < buckets_[b].range.second &&
            std::find(unit_buckets_[u].begin(), unit_buckets_[u].end(), b) ==
                unit_buckets_[u].end()) {
          unit_buckets_[u].push_back(b);
        }
      }
    }
  }
  backwards_.assign(units.size(), 0);
  pending_units_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_units_[b] = static_cast<int>(buckets_[b].units.size());
  }
  reduce_works_.assign(buckets_.size(), {});
  gather_works_.assign(buckets_.size(), {});
  return absl::OkStatus();
}

std::vector<BucketPart> GradientSync::Parts(const FlatRange& bucket) const {
  if (!expert_parallel()) return {BucketPart{bucket, bucket, false}};
  const layers::ParamBuffer& params = model_->params();
  std::vector<BucketPart> parts;
  for (size_t i = 0; i < params.params().size(); ++i) {
    const layers::Param& p = params.params()[i];
    const int64_t from = p.offset, to = params.SlotEnd({static_cast<int>(i)});
    if (from < bucket.first || from >= bucket.second) continue;
    if (!parts.empty() && parts.back().expert == p.spec->expert &&
        parts.back().range.second == from) {
      parts.back().range.second = to;
    } else {
      parts.push_back({{from, to}, {from, to}, p.spec->expert});
    }
  }
  return parts;
}

comm::Communicator* GradientSync::GroupOf(const BucketPart& part) const {
  comm::Communicator* group = shard_dp_;
  if (part.expert) {
    group = expert_instance_group_ ? expert_instance_group_.get() : groups_.expert_dp;
  }
  return group != nullptr && group->size() > 1 ? group : nullptr;
}

int64_t GradientSync::owned_numel() const {
  int64_t n = 0;
  for (const FlatRange& r : owned_) n += r.second - r.first;
  return n;
}

absl::Status GradientSync::LayoutShard() {
  readers_.assign(buckets_.size(), {});
  for (size_t u = 0; u < unit_buckets_.size(); ++u) {
    for (size_t b : unit_buckets_[u]) readers_[b].push_back(static_cast<int>(u));
  }
  contributed_.assign(buckets_.size(), {});
  for (size_t b = 0; b < buckets_.size(); ++b) contributed_[b].assign(readers_[b].size(), 0);
  open_backwards_.assign(unit_buckets_.size(), 0);
  // ZeRO-3: a bucket whose writers are not neighbours (the word embedding
  // at PP 1: the head's output layer and the embedding) is reduce-scattered
  // after each writer's backward instead of bound from the first to the
  // last, so no gradient buffer outlives its unit's backward: the pool
  // holds one unit's buckets, as the gathers do (twice the traffic for that
  // bucket; the shard sums both halves, linear: only rounding differs).
  flush_each_reader_.assign(buckets_.size(), false);
  for (size_t b = 0; b < buckets_.size() && options_.shard_params; ++b) {
    const std::vector<int>& r = readers_[b];
    if (r.empty()) continue;
    const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
    flush_each_reader_[b] = *hi - *lo + 1 != static_cast<int>(r.size());
  }
  bound_.assign(buckets_.size(), -1);
  last_buffer_.assign(buckets_.size(), -1);
  int64_t largest = 0;
  for (const GradBucket& b : buckets_) largest = std::max(largest, b.range.second - b.range.first);
  LOOM_ASSIGN_OR_RETURN(GradientShard shard,
                        GradientShard::Create(owned_, largest, model_->params().device()));
  shard_.emplace(std::move(shard));
  // From here on the gradients live in the shard and the pool: the model's
  // whole buffer is released, and Param::grad is bound bucket by bucket.
  return model_->params().BindGrads(Tensor());
}

int GradientSync::UnitIndex(int64_t unit) const {
  const std::vector<layers::ParamUnit>& units = model_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].id == unit) return static_cast<int>(u);
  }
  return -1;
}

absl::Status GradientSync::BeforeBackward(int64_t unit) {
  if (!zero2()) return absl::OkStatus();
  const int u = UnitIndex(unit);
  if (u < 0) {
    return absl::InternalError(absl::StrCat("GradientSync: the model reported unknown unit ", unit));
  }
  ++open_backwards_[u];
  // ZeRO-3: the unit's values first (its backward, or its recomputed
  // forward, reads them), then the previous unit's in the background.
  if (zero3()) LOOM_RETURN_IF_ERROR(AcquireUnit(u, u - 1));
  // The largest first, so it takes the buffer a previous micro-batch gave
  // it and a smaller bucket the next free one it fits (no reallocation).
  std::vector<size_t> order = unit_buckets_[u];
  auto size = [&](size_t b) { return buckets_[b].range.second - buckets_[b].range.first; };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return size(a) > size(b); });
  for (size_t b : order) {
    if (bound_[b] < 0) LOOM_RETURN_IF_ERROR(BindBucket(b));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::BindBucket(size_t b) {
  // The pool holds the buckets being written (two at once where a unit
  // writes two, e.g. the head's output layer tied to the word embedding on
  // the same stage, which stays bound until the embedding's backward), plus
  // with --overlap-grad-reduce one whose reduce-scatter runs behind the next
  // bucket's backward. A bucket takes the buffer it had last time once its
  // reduce-scatter has finished (so the pool settles on one buffer per
  // size it needs); beyond that a buffer still being reduce-scattered is
  // reused once that finishes.
  const int bound = static_cast<int>(std::count_if(bound_.begin(), bound_.end(),
                                                   [](int i) { return i >= 0; }));
  int target = bound + 1 + (options_.overlap_grad_reduce ? 1 : 0);
  const int last = last_buffer_[b];
  auto in_flight = [&](int buffer) {
    return std::any_of(in_flight_.begin(), in_flight_.end(),
                       [buffer](const Flush& f) { return f.buffer == buffer; });
  };
  while (last >= 0 && in_flight(last)) LOOM_RETURN_IF_ERROR(CompleteOldestFlush());
  while (!shard_->HasFree() && shard_->pool_size() >= target && !in_flight_.empty()) {
    LOOM_RETURN_IF_ERROR(CompleteOldestFlush());
  }
  if (!shard_->HasFree()) target = std::max(target, shard_->pool_size() + 1);
  const FlatRange& r = buckets_[b].range;
  LOOM_ASSIGN_OR_RETURN(const int i, shard_->Acquire(r.second - r.first, target, last));
  bound_[b] = i;
  last_buffer_[b] = i;
  return model_->params().BindGrads(r.first, r.second, shard_->buffer(i));
}

absl::Status GradientSync::FlushBucket(size_t b) {
  const FlatRange& r = buckets_[b].range;
  Flush f{b, bound_[b], {}};
  const Tensor& buffer = shard_->buffer(f.buffer);
  for (const BucketPart& part : buckets_[b].parts) {
    comm::Communicator* group = GroupOf(part);
    if (group == nullptr) continue;  // owned whole: added as it is
    // In place: this rank's slice of the part receives the average.
    LOOM_ASSIGN_OR_RETURN(Tensor all, Slice(buffer, {part.range.first - r.first,
                                                     part.range.second - r.first}));
    LOOM_ASSIGN_OR_RETURN(Tensor mine, Slice(buffer, {part.owned.first - r.first,
                                                      part.owned.second - r.first}));
    f.works.push_back(group->ReduceScatter(all, mine, comm::ReduceOp::kAvg));
  }
  LOOM_RETURN_IF_ERROR(model_->params().BindGrads(r.first, r.second, Tensor()));
  bound_[b] = -1;
  std::fill(contributed_[b].begin(), contributed_[b].end(), 0);
  in_flight_.push_back(std::move(f));
  if (!options_.overlap_grad_reduce) return CompleteOldestFlush();
  return absl::OkStatus();
}

absl::Status GradientSync::CompleteOldestFlush() {
  Flush f = std::move(in_flight_.front());
  in_flight_.pop_front();
  const auto start = std::chrono::steady_clock::now();
  absl::Status waited = comm::WaitAllOnStream(f.works);
  waited_s_ += SecondsSince(start);
  if (!waited.ok()) {
    return absl::Status(waited.code(), absl::StrCat("data-parallel gradient reduce-scatter: ",
                                                    waited.message()));
  }
  const FlatRange& r = buckets_[f.bucket].range;
  const Tensor& buffer = shard_->buffer(f.buffer);
  for (const BucketPart& part : buckets_[f.bucket].parts) {
    if (part.owned.second <= part.owned.first) continue;
    LOOM_ASSIGN_OR_RETURN(Tensor mine, Slice(buffer, {part.owned.first - r.first,
                                                      part.owned.second - r.first}));
    LOOM_ASSIGN_OR_RETURN(Tensor acc, shard_->Slice(part.owned.first, part.owned.second));
    LOOM_RETURN_IF_ERROR(core::ops::Add(acc, mine, &acc));
  }
  shard_->Release(f.buffer);
  return absl::OkStatus();
}

absl::Status GradientSync::FinishShardedGradients() {
  const auto start = std::chrono::steady_clock::now();
  // What is still bound (its last micro-batch's backward did not complete
  // it, e.g. a bucket that spans chunks of an interleaved schedule), from
  // the back of the buffer; then every reduce-scatter still running.
  for (size_t b = buckets_.size(); b-- > 0;) {
    if (bound_[b] >= 0) LOOM_RETURN_IF_ERROR(FlushBucket(b));
  }
  while (!in_flight_.empty()) LOOM_RETURN_IF_ERROR(CompleteOldestFlush());
  // ZeRO-3: a prefetch the backward left (nothing holds a unit now).
  if (zero3()) LOOM_RETURN_IF_ERROR(DropAllGathered());
  LOOM_RETURN_IF_ERROR(ReduceAcrossInstances());
  // The tied word embedding: rank r of both stages owns the same slice of
  // it, so the DP averages' slices are summed over the embedding group.
  std::vector<comm::WorkPtr> works;
  LOOM_RETURN_IF_ERROR(ForEachOwnedGradient(
      [&](const GradBucket& bucket, const BucketPart&, const Tensor& mine) {
        if (bucket.tied_embedding) {
          works.push_back(groups_.embedding->AllReduce(mine, comm::ReduceOp::kSum));
        }
        return absl::OkStatus();
      }));
  if (absl::Status summed = comm::WaitAllOnStream(works); !summed.ok()) {
    return absl::Status(summed.code(),
                        absl::StrCat("all-reduce of the tied word-embedding gradient shard over "
                                     "the embedding group: ",
                                     summed.message()));
  }
  LOOM_RETURN_IF_ERROR(ScaleExpertGradients());
  // Sequence-parallel parameters saw 1/TP of the rows on each TP rank: their
  // owned slices summed over TP (every TP rank owns the same flat ranges).
  const layers::TpGroup& tp = model_->tp();
  if (tp.sequence_parallel && tp.parallel()) {
    works.clear();
    for (const layers::Param& p : model_->params().params()) {
      if (!p.spec->sequence_parallel_grad) continue;
      const int64_t p_end = p.offset + p.shape.numel();
      for (const FlatRange& r : owned_) {
        const int64_t from = std::max(r.first, p.offset), to = std::min(r.second, p_end);
        if (from >= to) continue;
        LOOM_ASSIGN_OR_RETURN(Tensor part, shard_->Slice(from, to));
        works.push_back(tp.comm->AllReduce(part, comm::ReduceOp::kSum));
      }
    }
    if (absl::Status sp = comm::WaitAllOnStream(works); !sp.ok()) {
      return absl::Status(sp.code(),
                          absl::StrCat("sequence-parallel gradient all-reduce: ", sp.message()));
    }
  }
  exposed_grad_s_ = waited_s_ + SecondsSince(start);
  return absl::OkStatus();
}

absl::Status GradientSync::StartStep() {
  if (zero3()) {
    // A prefetch the last step (or evaluation) left behind, or what an
    // interrupted step still held.
    LOOM_RETURN_IF_ERROR(DropAllGathered());
    peak_gathered_bytes_ = 0;
    cold_gathers_ = 0;
  }
  if (zero2()) {
    // Whatever an interrupted step left bound goes back to the pool.
    while (!in_flight_.empty()) {
      comm::WaitAllOnStream(in_flight_.front().works).IgnoreError();
      shard_->Release(in_flight_.front().buffer);
      in_flight_.pop_front();
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (bound_[b] >= 0) shard_->Release(bound_[b]);
      bound_[b] = -1;
      std::fill(contributed_[b].begin(), contributed_[b].end(), 0);
    }
    std::fill(open_backwards_.begin(), open_backwards_.end(), 0);
    std::fill(backwards_.begin(), backwards_.end(), 0);
    LOOM_RETURN_IF_ERROR(ForgetReplicaReductions());
    LOOM_RETURN_IF_ERROR(model_->params().BindGrads(Tensor()));
    started_early_ = 0;
    waited_s_ = 0;
    return shard_->Zero();
  }
  std::fill(backwards_.begin(), backwards_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_units_[b] = static_cast<int>(buckets_[b].units.size());
  }
  LOOM_RETURN_IF_ERROR(ForgetReplicaReductions());
  started_early_ = 0;
  return model_->params().ZeroGrads();
}

absl::Status GradientSync::AfterBackward(int64_t unit) {
  const std::vector<layers::ParamUnit>& units = model_->units();
  if (zero2()) {
    // A bucket is flushed once every unit writing it has run a backward
    // since it was bound: once per micro-batch, or (a bucket spanning
    // interleaved chunks) at a point every rank reaches alike.
    const int u = UnitIndex(unit);
    if (u < 0) {
      return absl::InternalError(
          absl::StrCat("GradientSync: the model reported unknown unit ", unit));
    }
    if (open_backwards_[u] <= 0) {
      return absl::InternalError(absl::StrCat("GradientSync: unit ", unit,
                                              " ended a backward it did not begin"));
    }
    --open_backwards_[u];
    ++backwards_[u];
    for (size_t b : unit_buckets_[u]) {
      std::vector<int>& done = contributed_[b];
      const auto at = std::find(readers_[b].begin(), readers_[b].end(), u) - readers_[b].begin();
      ++done[at];
      // Not while a writer's deferred weight gradients are still to come.
      const bool open = std::any_of(readers_[b].begin(), readers_[b].end(),
                                    [&](int r) { return open_backwards_[r] > 0; });
      if (bound_[b] >= 0 && !open &&
          (flush_each_reader_[b] || std::find(done.begin(), done.end(), 0) == done.end())) {
        ++started_early_;
        LOOM_RETURN_IF_ERROR(FlushBucket(b));
      }
    }
    LOOM_RETURN_IF_ERROR(StartReplicaReductions(/*wait=*/false));
    if (zero3()) return ReleaseUnit(u);
    return absl::OkStatus();
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].id != unit) continue;
    if (++backwards_[u] == options_.micro_batches) {
      const int b = unit_bucket_[u];
      if (b >= 0 && --pending_units_[b] == 0 && options_.overlap_grad_reduce && data_parallel() &&
          !buckets_[b].tied_embedding) {
        ++started_early_;
        LOOM_RETURN_IF_ERROR(StartBucket(b));
      }
    }
    // A bucket reduced behind the backward goes on to the replicas.
    return StartReplicaReductions(/*wait=*/false);
  }
  return absl::InternalError(absl::StrCat("GradientSync: the model reported unknown unit ", unit));
}

absl::Status GradientSync::StartBucket(size_t b) {
  const Tensor& grads = model_->params().flat_grads();
  std::vector<comm::WorkPtr>& works = reduce_works_[b];
  for (const BucketPart& part : buckets_[b].parts) {
    comm::Communicator* group = GroupOf(part);
    if (group == nullptr) continue;
    LOOM_ASSIGN_OR_RETURN(Tensor all, Slice(grads, part.range));
    if (sharded()) {
      // In place: this rank's slice of the part receives the average.
      LOOM_ASSIGN_OR_RETURN(Tensor mine, Slice(grads, part.owned));
      works.push_back(group->ReduceScatter(all, mine, comm::ReduceOp::kAvg));
    } else {
      works.push_back(group->AllReduce(all, comm::ReduceOp::kAvg));
    }
  }
  if (works.empty()) {  // nothing to reduce: mark it started
    works.push_back(comm::CompletedWork(absl::OkStatus(), "gradient bucket"));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::FinishGradients() {
  if (zero2()) return FinishShardedGradients();
  const auto start = std::chrono::steady_clock::now();
  absl::Status status;
  // Whatever the backward did not start, from the back of the buffer, as an
  // overlapped run would have started it.
  if (data_parallel()) {
    for (size_t b = buckets_.size(); b-- > 0;) {
      if (reduce_works_[b].empty() && !buckets_[b].tied_embedding) {
        status.Update(StartBucket(b));
      }
    }
  }
  // The tied word embedding: both stages' copies summed first (their DP
  // shards differ, the whole tensors do not), then averaged over DP.
  for (size_t b = 0; b < buckets_.size() && status.ok(); ++b) {
    if (!buckets_[b].tied_embedding) continue;
    layers::Param& word = model_->params().at(model_->word_embedding());
    absl::Status summed =
        groups_.embedding->AllReduce(word.grad, comm::ReduceOp::kSum)->WaitOnStream();
    if (!summed.ok()) {
      status.Update(absl::Status(summed.code(),
                                 absl::StrCat("all-reduce of the tied word-embedding gradient "
                                              "over the embedding group: ",
                                              summed.message())));
    } else if (data_parallel()) {
      status.Update(StartBucket(b));
    }
  }
  std::vector<comm::WorkPtr> works;
  for (const std::vector<comm::WorkPtr>& bucket : reduce_works_) {
    works.insert(works.end(), bucket.begin(), bucket.end());
  }
  absl::Status waited = comm::WaitAllOnStream(works);
  if (!waited.ok()) {
    status.Update(absl::Status(waited.code(), absl::StrCat("data-parallel gradient reduction: ",
                                                           waited.message())));
  }
  // (The buckets' works are kept until here: the replicas' all-reduces
  // follow them bucket by bucket.)
  if (status.ok()) status.Update(ReduceAcrossInstances());
  for (std::vector<comm::WorkPtr>& bucket : reduce_works_) bucket.clear();
  if (status.ok()) status.Update(ScaleExpertGradients());
  if (status.ok()) {
    // Sequence-parallel parameters saw 1/TP of the rows on each TP rank.
    absl::Status sp =
        layers::AllReduceSequenceParallelGrads(model_->tp(), &model_->params(), owned_);
    if (!sp.ok()) {
      status = absl::Status(sp.code(),
                            absl::StrCat("sequence-parallel gradient all-reduce: ", sp.message()));
    }
  }
  std::fill(backwards_.begin(), backwards_.end(), 0);
  exposed_grad_s_ = SecondsSince(start);
  return status;
}

absl::Status GradientSync::ReduceAcrossInstances() {
  if (replicas_ == nullptr) return absl::OkStatus();
  // What the backward did not start, then every replica all-reduce.
  LOOM_RETURN_IF_ERROR(StartReplicaReductions(/*wait=*/true));
  std::vector<comm::WorkPtr> works = std::move(replica_works_);
  replica_works_.clear();
  if (absl::Status st = comm::WaitAllOnStream(works); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("all-reduce of the gradient shard across the "
                                     "--num-distributed-optimizer-instances replicas: ",
                                     st.message()));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::StartReplicaReductions(bool wait) {
  if (replicas_ == nullptr) return absl::OkStatus();
  // Each instance averaged its own ranks' gradients into this rank's shard;
  // the mean of the N instances' means is the mean over the whole group. A
  // bucket's all-reduce starts once its instance reduction is complete, in
  // bucket order from the back of the buffer: the same order on every
  // replica, however their reductions happen to finish.
  if (zero2() && !wait) {
    // Reduce-scatters that finished behind the backward are added now (no
    // collective: the order of this is free).
    while (!in_flight_.empty() && AllDone(in_flight_.front().works)) {
      LOOM_RETURN_IF_ERROR(CompleteOldestFlush());
    }
  }
  while (next_replica_ < buckets_.size()) {
    const size_t b = buckets_.size() - 1 - next_replica_;
    LOOM_ASSIGN_OR_RETURN(const bool reduced, InstanceReduced(b, wait));
    if (!reduced) return absl::OkStatus();
    LOOM_RETURN_IF_ERROR(
        ForEachOwnedGradientOf(b, [&](const BucketPart&, const Tensor& mine) {
          replica_works_.push_back(replicas_->AllReduce(mine, comm::ReduceOp::kAvg));
          return absl::OkStatus();
        }));
    if (!wait) ++replicas_started_early_;
    ++next_replica_;
  }
  return absl::OkStatus();
}

absl::Status GradientSync::ForgetReplicaReductions() {
  // What an interrupted step left in flight is waited for (never free
  // memory a collective writes), then forgotten.
  absl::Status st = comm::WaitAllOnStream(replica_works_);
  replica_works_.clear();
  next_replica_ = 0;
  replicas_started_early_ = 0;
  return st;
}

bool GradientSync::AllDone(const std::vector<comm::WorkPtr>& works) {
  return std::all_of(works.begin(), works.end(), [](const comm::WorkPtr& w) { return w->Poll(); });
}

absl::StatusOr<bool> GradientSync::InstanceReduced(size_t b, bool wait) {
  if (zero2()) {
    // At the end of the step everything is flushed and added. Before: every
    // writer ran its last backward of the step, the bucket is unbound, and
    // none of its reduce-scatters is still to be added.
    if (wait) return true;
    for (int r : readers_[b]) {
      if (backwards_[r] < options_.micro_batches) return false;
    }
    return bound_[b] < 0 && std::none_of(in_flight_.begin(), in_flight_.end(),
                                          [b](const Flush& f) { return f.bucket == b; });
  }
  const std::vector<comm::WorkPtr>& works = reduce_works_[b];
  if (works.empty() && wait) {
    // Every replica must start every bucket's all-reduce, or they deadlock.
    return absl::InternalError(
        absl::StrCat("GradientSync: bucket ", b, " was not reduced before the step's end"));
  }
  if (works.empty()) return false;  // not started yet
  if (!wait) return AllDone(works);
  if (absl::Status st = comm::WaitAllOnStream(works); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("data-parallel gradient reduction: ", st.message()));
  }
  return true;
}

absl::Status GradientSync::ScaleExpertGradients() {
  if (!expert_parallel()) return absl::OkStatus();
  // Each expert's gradient sums every EP rank's tokens: 1 / EP more makes it
  // the mean over all DP ranks' losses, as the dense gradients are.
  const float scale = 1.0f / static_cast<float>(groups_.expert_parallel);
  return ForEachOwnedGradient([scale](const GradBucket&, const BucketPart& part, Tensor mine) {
    return part.expert ? core::ops::Scale(scale, &mine) : absl::OkStatus();
  });
}

absl::Status GradientSync::ForEachOwnedGradient(
    const std::function<absl::Status(const GradBucket&, const BucketPart&, Tensor)>& fn) {
  for (size_t b = buckets_.size(); b-- > 0;) {
    LOOM_RETURN_IF_ERROR(ForEachOwnedGradientOf(
        b, [&](const BucketPart& part, Tensor mine) { return fn(buckets_[b], part, mine); }));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::ForEachOwnedGradientOf(
    size_t b, const std::function<absl::Status(const BucketPart&, Tensor)>& fn) {
  for (const BucketPart& part : buckets_[b].parts) {
    if (part.owned.second <= part.owned.first) continue;
    Tensor mine;
    if (zero2()) {
      LOOM_ASSIGN_OR_RETURN(mine, shard_->Slice(part.owned.first, part.owned.second));
    } else {
      LOOM_ASSIGN_OR_RETURN(mine, Slice(model_->params().flat_grads(), part.owned));
    }
    LOOM_RETURN_IF_ERROR(fn(part, mine));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::StartParamGather() {
  exposed_gather_s_ = 0;
  // ZeRO-3: the optimizer updated the owned values in place; the next
  // forward gathers each unit's when it needs them.
  if (!sharded() || zero3()) return absl::OkStatus();
  const Tensor& values = model_->params().flat_values();
  // In forward order, so the first buckets the next forward needs come first.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (const BucketPart& part : buckets_[b].parts) {
      comm::Communicator* group = GroupOf(part);
      if (group == nullptr) continue;  // owned whole: nothing to gather
      LOOM_ASSIGN_OR_RETURN(Tensor mine, Slice(values, part.owned));
      LOOM_ASSIGN_OR_RETURN(Tensor all, Slice(values, part.range));
      gather_works_[b].push_back(group->AllGather(mine, all));
    }
  }
  if (options_.overlap_param_gather) return absl::OkStatus();
  return FinishParamGather();
}

absl::Status GradientSync::WaitGather(size_t b) {
  if (gather_works_[b].empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  std::vector<comm::WorkPtr> works = std::move(gather_works_[b]);
  gather_works_[b].clear();
  absl::Status st = comm::WaitAllOnStream(works);
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("all-gather of updated parameters: ", st.message()));
  }
  // The bf16 weights the layers compute with, for the gathered bucket.
  LOOM_RETURN_IF_ERROR(
      model_->params().SyncComputeCopy(buckets_[b].range.first, buckets_[b].range.second));
  exposed_gather_s_ += SecondsSince(start);
  return absl::OkStatus();
}

absl::Status GradientSync::FinishParamGather() {
  // ZeRO-3: nothing to wait for outside a pass; what a pass kept for the
  // next one (after an evaluation, a save) is freed.
  if (zero3()) return DropAllGathered();
  absl::Status status;
  for (size_t b = 0; b < buckets_.size(); ++b) status.Update(WaitGather(b));
  return status;
}

absl::Status GradientSync::BeforeForward(int64_t unit) {
  const std::vector<layers::ParamUnit>& units = model_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].id != unit) continue;
    if (zero3()) {
      const int next = u + 1 < units.size() ? static_cast<int>(u + 1) : -1;
      return AcquireUnit(static_cast<int>(u), next);
    }
    for (size_t b : unit_buckets_[u]) LOOM_RETURN_IF_ERROR(WaitGather(b));
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("GradientSync: the model reported unknown unit ", unit));
}

absl::Status GradientSync::AfterForward(int64_t unit) {
  if (!zero3()) return absl::OkStatus();
  const int u = UnitIndex(unit);
  if (u < 0) {
    return absl::InternalError(absl::StrCat("GradientSync: the model reported unknown unit ", unit));
  }
  return ReleaseUnit(u);
}

absl::Status GradientSync::AcquireUnit(int u, int prefetch) {
  // Start every bucket the unit reads that is not gathered or on its way
  // (all before the first wait, so they run together), then wait and bind.
  bool cold = false;
  for (size_t b : unit_buckets_[u]) {
    cold |= !gathered_[b].master.defined();
    LOOM_RETURN_IF_ERROR(StartValueGather(b));
  }
  if (cold) ++cold_gathers_;
  for (size_t b : unit_buckets_[u]) {
    LOOM_RETURN_IF_ERROR(BindGathered(b));
    ++gathered_[b].holds;
    gathered_[b].prefetched = false;
  }
  // A prefetch the schedule did not take (e.g. the next layer while a
  // pipeline schedule runs another micro-batch's chunk next) is dropped.
  for (size_t b = 0; b < gathered_.size(); ++b) {
    if (gathered_[b].prefetched && gathered_[b].holds == 0) {
      gathered_[b].prefetched = false;
      LOOM_RETURN_IF_ERROR(DropGathered(b));
    }
  }
  if (!options_.overlap_param_gather || prefetch < 0) return absl::OkStatus();
  for (size_t b : unit_buckets_[prefetch]) {
    LOOM_RETURN_IF_ERROR(StartValueGather(b));
    gathered_[b].prefetched = true;
  }
  return absl::OkStatus();
}

absl::Status GradientSync::ReleaseUnit(int u) {
  for (size_t b : unit_buckets_[u]) {
    Gathered& g = gathered_[b];
    if (g.holds == 0) {
      return absl::InternalError(absl::StrCat("GradientSync: unit ", model_->units()[u].id,
                                              " released parameters it did not gather"));
    }
    if (--g.holds > 0 || g.prefetched) continue;
    if (options_.overlap_param_gather && options_.prefetch_across_passes) {
      g.prefetched = true;  // kept: the next pass may start with this unit
    } else {
      LOOM_RETURN_IF_ERROR(DropGathered(b));
    }
  }
  return absl::OkStatus();
}

absl::Status GradientSync::StartValueGather(size_t b) {
  Gathered& g = gathered_[b];
  if (g.master.defined()) return absl::OkStatus();  // held, or on its way
  const FlatRange& r = buckets_[b].range;
  {
    // The transient whole bucket: communication memory in the ledger.
    core::MemoryScope tag(core::MemoryCategory::kCommunication);
    LOOM_ASSIGN_OR_RETURN(g.master, Tensor::Empty(core::Shape{r.second - r.first},
                                                  core::DType::kF32, model_->params().device()));
  }
  gathered_bytes_ += static_cast<int64_t>(g.master.nbytes());
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  for (const BucketPart& part : buckets_[b].parts) {
    LOOM_ASSIGN_OR_RETURN(Tensor mine, values_->Slice(part.owned.first, part.owned.second));
    LOOM_ASSIGN_OR_RETURN(Tensor all, Slice(g.master, {part.range.first - r.first,
                                                       part.range.second - r.first}));
    comm::Communicator* group = GroupOf(part);
    if (group == nullptr) {  // owned whole: a copy
      LOOM_RETURN_IF_ERROR(core::ops::Copy(mine, &all));
      continue;
    }
    g.works.push_back(group->AllGather(mine, all));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::BindGathered(size_t b) {
  Gathered& g = gathered_[b];
  if (g.bound) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  std::vector<comm::WorkPtr> works = std::move(g.works);
  g.works.clear();
  if (absl::Status st = comm::WaitAllOnStream(works); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("all-gather of a unit's parameters (ZeRO-3): ", st.message()));
  }
  exposed_gather_s_ += SecondsSince(start);
  const FlatRange& r = buckets_[b].range;
  if (model_->params().compute_dtype() != core::DType::kF32) {
    // The bf16 weights the layers compute with, from the gathered f32 (as
    // ParamBuffer::SyncComputeCopy makes them without ZeRO-3).
    core::MemoryScope tag(core::MemoryCategory::kCommunication);
    LOOM_ASSIGN_OR_RETURN(g.compute, Tensor::Empty(g.master.shape(),
                                                   model_->params().compute_dtype(),
                                                   g.master.device()));
    LOOM_RETURN_IF_ERROR(core::ops::Convert(g.master, &g.compute));
    gathered_bytes_ += static_cast<int64_t>(g.compute.nbytes());
  }
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  g.bound = true;
  return model_->params().BindValues(r.first, r.second, g.master, g.compute);
}

absl::Status GradientSync::DropGathered(size_t b) {
  Gathered& g = gathered_[b];
  if (!g.master.defined()) return absl::OkStatus();
  absl::Status st = comm::WaitAllOnStream(g.works);  // never free memory a gather writes
  g.works.clear();
  if (g.bound) {
    const FlatRange& r = buckets_[b].range;
    st.Update(model_->params().BindValues(r.first, r.second, Tensor(), Tensor()));
  }
  gathered_bytes_ -= static_cast<int64_t>(g.master.nbytes()) +
                     (g.compute.defined() ? static_cast<int64_t>(g.compute.nbytes()) : 0);
  g = Gathered();
  return st;
}

absl::Status GradientSync::DropAllGathered() {
  absl::Status status;
  for (size_t b = 0; b < gathered_.size(); ++b) status.Update(DropGathered(b));
  return status;
}

}  // namespace loom::distributed
