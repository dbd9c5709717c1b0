#ifndef LOOM_DISTRIBUTED_GRADIENT_SYNC_H_
#define LOOM_DISTRIBUTED_GRADIENT_SYNC_H_

// GradientSync: the one owner of a rank's gradient buffer between the model's
// backward and the optimizer (the role of Megatron's DistributedDataParallel
// and its param-and-grad buffer). The model only computes, the optimizer only
// updates; everything that makes the gradients of a step final is here:
//
//   StartStep()          zero the flat gradient buffer
//   ... the pipeline runs forwards and backwards; the model's unit events report
//       each unit's backward, and with --overlap-grad-reduce a bucket's
//       data-parallel reduction starts as soon as its last backward of the
//       step has run ...
//   FinishGradients()    start what is left: the tied word embedding is first
//                        summed over the embedding group (first + last
//                        pipeline stage), then reduced over DP like the rest;
//                        wait; then sum the sequence-parallel gradients over
//                        TP. The gradients in owned() are now final.
//   optimizer step       updates owned() (the whole buffer, or this rank's
//                        ZeRO-1 shard)
//   StartParamGather()   ZeRO-1: all-gather the updated shards bucket by
//                        bucket; with --overlap-param-gather each forward
//                        waits only for the buckets it is about to read.
//
// Buckets. The flat buffer is cut into buckets of whole parameter units (a
// transformer layer, the embedding, the head), built from the back of the
// buffer, where the backward starts, up to OptimizerConfig::bucket_bytes
// each. Data parallelism averages a bucket with one all-reduce, or with the
// distributed optimizer one reduce-scatter: every parameter's slot is padded
// to a multiple of DP (ParamBuffer), so each bucket splits into DP equal
// slices and rank r owns slice r of every bucket.
//
// Expert parallelism (EP > 1) splits each bucket into parts: runs of expert
// weights, averaged (and under ZeRO-1 sharded) over the expert-data-parallel
// group, and runs of the rest, over DP (Megatron's rule). Rank r then owns
// slice r of each part, r its rank in the part's group.
//
// ZeRO-2 (shard_gradients, --data-parallel-sharding-strategy=optim_grads):
// the same buckets and slices, but the gradients are not kept whole. Before
// a unit's backward (BeforeBackward; for a recomputed unit before its
// recomputation) each bucket it writes is bound to a zeroed buffer of a
// small pool (GradientShard); once every unit of the bucket has run its
// backward since the bucket was bound, the buffer is reduce-scattered (every
// micro-batch, not only the last) and this rank's slice added to its f32
// shard, then the buffer goes back to the pool. Without
// --overlap-grad-reduce that happens at once; with it the reduce-scatter
// runs behind the backward and is finished when the pool needs the buffer
// or in FinishGradients. The tied word embedding is reduce-scattered like
// the rest and its shard summed over the embedding group at the end (both
// stages' rank r own the same slice of it); the sequence-parallel sum and
// the experts' 1 / EP act on the shard. Sums are linear: only rounding
// differs from ZeRO-1.
//
// ZeRO-3 (shard_params, --data-parallel-sharding-strategy=optim_grads_params):
// ZeRO-2, and the parameters are sharded at rest too. The model is built
// without value buffers (GptConfig::allocate_parameters); this rank keeps
// only the f32 values of owned() (ParamShard, the optimizer's moment
// layout), which the optimizer updates in place: nothing is all-gathered
// after the step. Before a unit's forward (BeforeForward) and again before
// its backward (BeforeBackward, which a recomputed forward follows) every
// bucket it reads is all-gathered from the owned slices into a buffer (and
// its bf16 compute copy converted from it under --bf16) bound to the
// parameters' Param::value views (ParamBuffer::BindValues); after the
// unit's forward or backward the buffer is released, unless another unit
// still holds the bucket (a bucket spanning units). With
// --overlap-param-gather the next unit's buckets (the next in forward order
// during a forward, the previous during a backward) start gathering as soon
// as the current unit's are bound, behind its computation; a guess the
// schedule does not take is dropped at the next unit. Across passes
// (prefetch_across_passes): a unit's gather is kept when the unit ends, as
// the guess that the next pass starts with it: the forward ends with the
// unit the backward starts with (the head), the backward with the one the
// next micro-batch's forward starts with (the embedding), so a pass's first
// unit is no longer gathered cold; a wrong guess (the next unit in a pass,
// another chunk under PP) is dropped at the next unit as any prefetch. The tied word
// embedding (the embedding's and the head's, at PP 1) is gathered by each
// of the two units that read it, each time, and its gradient bucket is
// reduce-scattered after each of their backwards (not bound from the head's
// to the embedding's: no buffer outlives its unit); at PP > 1 each end stage
// holds its own copy, sharded alike, updated alike from the summed gradient.
// Gather buffers are transient communication memory in the ledger.
//
// Hybrid sharding (--num-distributed-optimizer-instances N, Megatron's
// name; options.instances): the gradient group (DP x CP, g ranks) splits into
// N instances of g / N consecutive ranks (instance i: ranks i g/N ... (i+1)
// g/N - 1 of the group, each DP rank with all its CP ranks). Everything the
// strategy shards is sharded within an instance (shard_group(): ownership,
// reduce-scatters, ZeRO-1's and ZeRO-3's all-gathers), and the instances
// hold replicas: rank r of every instance owns the same ranges (replicas():
// the N ranks with the same rank in their instance). A step's gradients are
// reduce-scattered within the instance (averaged over its g / N ranks, every
// micro-batch under ZeRO-2/3), then each bucket's owned shard is
// all-reduced across the instances (averaged over N: the mean over all g),
// once per step, as soon as the bucket's last instance reduction of the
// step has finished: behind the rest of the backward with
// --overlap-grad-reduce (polled at each unit's end, started in bucket
// order from the back so the replicas' collectives match), else in
// FinishGradients. The replicas then apply the same update to the same
// values.
// N = 1 is the plain layout; N = g leaves one rank per instance (nothing
// sharded, the replicas all-reduce everything). Needs a sharding strategy.
// Under EP each instance holds whole EP groups (DP / N a multiple of EP):
// the expert parts are sharded over the instance's share of expert_dp, and
// a rank's replicas hold its experts, so the one replicas group averages
// both kinds of part.
//
// Every DP rank (and TP rank) holds the same layout and runs the same
// schedule, so buckets start in the same order everywhere: the collectives
// match. All reductions are linear, so their order does not change the
// result beyond rounding.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/comm.h"
#include "distributed/gradient_shard.h"
#include "distributed/param_shard.h"
#include "layers/stage_model.h"

namespace loom::distributed {

// [begin, end) of the flat parameter/gradient buffers.
using FlatRange = std::pair<int64_t, int64_t>;

struct GradientSyncOptions {
  int64_t micro_batches = 1;         // backwards of each unit per step
  int64_t bucket_bytes = 4 << 20;    // f32 gradient bytes per bucket (a unit is never split)
  bool overlap_grad_reduce = false;  // --overlap-grad-reduce
  bool distributed_optimizer = false;  // --use-distributed-optimizer (ZeRO-1)
  bool overlap_param_gather = false;   // --overlap-param-gather (needs the distributed optimizer)
  // --data-parallel-sharding-strategy=optim_grads (ZeRO-2; needs the
  // distributed optimizer): only the owned shard of the gradients is kept.
  bool shard_gradients = false;
  // --data-parallel-sharding-strategy=optim_grads_params (ZeRO-3; needs
  // shard_gradients): the parameters' values are sharded as well.
  bool shard_params = false;
  // ZeRO-3 with overlap_param_gather: prefetch across passes too (see above;
  // false: only the next unit within a pass, as before; //distributed:bench
  // compares both).
  bool prefetch_across_passes = true;
  // --num-distributed-optimizer-instances (hybrid sharding; see above): >= 1,
  // divides the gradient group; > 1 needs distributed_optimizer.
  int instances = 1;
};

struct GradientSyncGroups {
  // The gradient group (DP x CP); null or size 1: no data parallelism. With
  // options.instances > 1, Create splits it into instances and replicas.
  comm::Communicator* dp = nullptr;
  // The first and last pipeline stage (PP > 1, on those stages): the tied word
  // embedding's two copies are summed over it (unused when the model's output
  // layer is untied). Null otherwise.
  comm::Communicator* embedding = nullptr;
  // Expert parallelism (EP > 1): the MoE experts' weights (ParamSpec::expert)
  // differ between the EP ranks of a DP group, so instead of DP they are
  // averaged (and under ZeRO-1 sharded) over `expert_dp`, the DP / EP x CP
  // ranks that hold the same experts (null or size 1: none), and scaled by
  // 1 / EP: each expert's gradient already sums the contributions of all EP
  // ranks' tokens, and the step's loss is the mean over all DP x CP ranks.
  comm::Communicator* expert_dp = nullptr;
  int expert_parallel = 1;
};

// A run of a bucket reduced over one group: DP, or expert_dp for expert
// weights (EP only).
struct BucketPart {
  FlatRange range;      // whole parameter slots
  FlatRange owned;      // this rank's slice of it under ZeRO-1, else all of it
  bool expert = false;  // ParamSpec::expert under EP
};

// One bucket of the flat buffers.
struct GradBucket {
  FlatRange range;                 // whole parameter slots (padding included)
  std::vector<int64_t> units;      // units whose gradients complete it
  bool tied_embedding = false;     // summed over the embedding group before DP
  std::vector<BucketPart> parts;   // tile `range` in order; one part without EP
};

// A UnitObserver of the model (privately: only the model calls it): each
// unit's forward waits for its parameter gather, each unit's backward may
// complete a bucket and start its reduction.
class GradientSync : private layers::UnitObserver {
 public:
  // Lays out the buckets and adds itself to the model's observers. `model`
  // must outlive the GradientSync (which removes itself when destroyed).
  // ZeRO-2 releases the model's whole gradient buffer here if it has one
  // (the trainer builds it without: GptConfig::allocate_gradients), and the
  // model keeps none afterwards (ParamBuffer::BindGrads gives it one back).
  static absl::StatusOr<std::unique_ptr<GradientSync>> Create(layers::StageModel* model,
                                                              const GradientSyncGroups& groups,
                                                              const GradientSyncOptions& options);
  ~GradientSync() override;
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // The step boundary: zeroes the gradients and forgets last step's progress.
  // Under ZeRO-2 the model's Param::grad views are unbound between steps.
  absl::Status StartStep();
  // After the step's last backward: returns once the gradients in owned()
  // are final (see the top of this file). Collective over DP, TP and the
  // embedding group.
  absl::Status FinishGradients();
  // After the optimizer updated owned(): without ZeRO-1 nothing moves; with
  // it, the updated slices are all-gathered bucket by bucket (and the bf16
  // compute copy refreshed). Waits for them unless --overlap-param-gather.
  absl::Status StartParamGather();
  // Waits for every parameter gather still in flight: before reading the
  // values outside a forward (checkpoints). A forward waits by itself.
  // ZeRO-3: frees every gathered bucket, a prefetch kept for the next pass
  // included (after an evaluation: the next step gathers its own).
  absl::Status FinishParamGather();

  // The flat ranges whose final gradients this rank holds and whose values
  // it updates, in buffer order: the whole buffer, or its ZeRO-1 shard (a
  // slice of each bucket part).
  const std::vector<FlatRange>& owned() const { return owned_; }
  int64_t owned_numel() const;
  // ZeRO-2: the final gradients of owned(), back to back in its order (the
  // optimizer's moment layout); undefined otherwise (they are in the
  // model's flat gradient buffer, at their flat offsets).
  core::Tensor owned_grads() const { return shard_ ? shard_->shard() : core::Tensor(); }
  // ZeRO-2: the transient bucket buffers held now, and their bytes; 0
  // otherwise.
  int grad_buffers() const { return shard_ ? shard_->pool_size() : 0; }
  int64_t grad_buffer_bytes() const { return shard_ ? shard_->pool_bytes() : 0; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // ZeRO-3: the values of owned(), back to back in its order (what the
  // optimizer updates and a checkpoint saves); undefined otherwise.
  core::Tensor owned_values() const { return values_ ? values_->shard() : core::Tensor(); }
  core::Tensor* mutable_owned_values() { return values_ ? &values_->mutable_shard() : nullptr; }
  // ZeRO-3: the bytes of gathered buckets held now (f32 and compute copy),
  // and the most held at once since StartStep.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  // ZeRO-3: the units of the last step (since StartStep) whose gather was
  // started when the unit began, not prefetched: a wait nothing hid.
  int cold_gathers() const { return cold_gathers_; }
  // ZeRO-3: the buckets each unit gathers (per units() index).
  const std::vector<std::vector<size_t>>& unit_buckets() const { return unit_buckets_; }

  // The group owned() is a shard of (what the optimizer's gradient norm sums
  // over): the gradient group, or this rank's instance under hybrid
  // sharding; null without data parallelism.
  comm::Communicator* shard_group() const { return shard_dp_; }
  // Hybrid sharding: this rank's instance (0 .. instances - 1) and the group
  // of its replicas (null when instances == 1).
  int instance() const { return instance_index_; }
  comm::Communicator* replicas() const { return replicas_.get(); }

  // What was not hidden behind computation in the last step, in seconds:
  // the wait in FinishGradients, and the waits for parameter gathers (in
  // StartParamGather, the forward's BeforeForward and FinishParamGather).
  double exposed_grad_seconds() const { return exposed_grad_s_; }
  double exposed_gather_seconds() const { return exposed_gather_s_; }
  // Buckets whose reduction started during the backward in the last step
  // (ZeRO-2: reduce-scatters, one per bucket and micro-batch).
  int buckets_started_early() const { return started_early_; }
  // Hybrid sharding: buckets whose all-reduce across the replicas started
  // during the backward in the last step (the rest start in
  // FinishGradients).
  int replica_reductions_started_early() const { return replicas_started_early_; }

 private:
  GradientSync(layers::StageModel* model, GradientSyncGroups groups, GradientSyncOptions options)
      : model_(model), groups_(groups), options_(options), shard_dp_(groups.dp) {}
  absl::Status SplitInstances();
  absl::Status Layout();
  absl::Status AfterBackward(int64_t unit) override;
  absl::Status BeforeForward(int64_t unit) override;
  absl::Status BeforeBackward(int64_t unit) override;
  absl::Status AfterForward(int64_t unit) override;
  absl::Status StartBucket(size_t b);
  int UnitIndex(int64_t unit) const;  // -1: unknown
  // ZeRO-2 (see the top of this file).
  absl::Status LayoutShard();
  absl::Status BindBucket(size_t b);
  absl::Status FlushBucket(size_t b);  // starts its reduce-scatter, unbinds it
  absl::Status CompleteOldestFlush();  // waits, adds into the shard, frees the buffer
  absl::Status FinishShardedGradients();
  absl::Status WaitGather(size_t b);
  // ZeRO-3 (see the top of this file).
  bool zero3() const { return options_.shard_params; }
  absl::Status AcquireUnit(int u, int prefetch);  // prefetch: a units() index, or -1
  absl::Status ReleaseUnit(int u);
  absl::Status StartValueGather(size_t b);
  absl::Status BindGathered(size_t b);
  absl::Status DropGathered(size_t b);  // waits for its gather, frees it
  absl::Status DropAllGathered();
  // Hybrid sharding: the owned gradients averaged over the replicas: each
  // bucket's all-reduce started as soon as its instance reduction is
  // complete (behind the backward, polled at each unit's AfterBackward;
  // with `wait`, at the end of the step, waiting for each in turn), in
  // bucket order from the back; ReduceAcrossInstances starts the rest and
  // waits for them all.
  absl::Status ReduceAcrossInstances();
  absl::Status StartReplicaReductions(bool wait);
  absl::StatusOr<bool> InstanceReduced(size_t b, bool wait);
  absl::Status ForgetReplicaReductions();
  static bool AllDone(const std::vector<comm::WorkPtr>& works);
  // EP: the owned expert gradients times 1 / EP (see GradientSyncGroups).
  absl::Status ScaleExpertGradients();
  // fn(bucket, part, its owned final gradients) for every bucket part with
  // an owned slice, from the back of the buffer; the gradients are the
  // shard's under ZeRO-2, else the flat buffer's.
  absl::Status ForEachOwnedGradient(
      const std::function<absl::Status(const GradBucket&, const BucketPart&, core::Tensor)>& fn);
  absl::Status ForEachOwnedGradientOf(
      size_t b, const std::function<absl::Status(const BucketPart&, core::Tensor)>& fn);
  bool data_parallel() const { return groups_.dp != nullptr && groups_.dp->size() > 1; }
  bool sharded_over(const comm::Communicator* c) const { return c != nullptr && c->size() > 1; }
  bool expert_parallel() const { return groups_.expert_parallel > 1; }
  bool sharded() const { return options_.distributed_optimizer && sharded_over(shard_dp_); }
  bool zero2() const { return options_.shard_gradients; }
  // The group a part is averaged (and sharded) over; null when it has no
  // replicas to average with.
  comm::Communicator* GroupOf(const BucketPart& part) const;
  // The bucket's parts: its expert and dense runs under EP, else all of it.
  std::vector<BucketPart> Parts(const FlatRange& bucket) const;

  layers::StageModel* model_;
  GradientSyncGroups groups_;
  GradientSyncOptions options_;
  // Hybrid sharding's groups (null with one instance); shard_dp_ is the
  // instance, or groups_.dp; expert_instance_group_ (EP) the instance's
  // share of groups_.expert_dp.
  std::unique_ptr<comm::Communicator> instance_group_, replicas_, expert_instance_group_;
  comm::Communicator* shard_dp_ = nullptr;
  int instance_index_ = 0;
  std::vector<GradBucket> buckets_;
  std::vector<FlatRange> owned_;
  std::vector<std::vector<size_t>> unit_buckets_;  // per units() index: buckets it reads
  std::vector<int> unit_bucket_;                   // per units() index: the bucket it completes, or -1
  // Per step.
  std::vector<int64_t> backwards_;   // per units() index
  std::vector<int> pending_units_;   // per bucket: units not yet complete
  std::vector<std::vector<comm::WorkPtr>> reduce_works_;  // per bucket (empty: not started)
  std::vector<std::vector<comm::WorkPtr>> gather_works_;  // per bucket (empty: none in flight)
  // ZeRO-2.
  std::optional<GradientShard> shard_;
  std::vector<std::vector<int>> readers_;      // per bucket: units() indices that write it
  std::vector<std::vector<int>> contributed_;  // per bucket, per reader: backwards since bound
  std::vector<int> bound_;                     // per bucket: its pool buffer, or -1
  // Per units() index: BeforeBackwards not yet closed by their AfterBackward.
  // A split backward (zb-h1, zbv, dualpipev) opens a unit at I and closes it
  // at its deferred W, and other micro-batches' I may come in between: a
  // bucket stays bound while any of its writers is open.
  std::vector<int> open_backwards_;
  std::vector<bool> flush_each_reader_;        // per bucket (ZeRO-3; see LayoutShard)
  std::vector<int> last_buffer_;               // per bucket: the buffer it had last, or -1
  struct Flush {
    size_t bucket;
    int buffer;
    std::vector<comm::WorkPtr> works;
  };
  std::deque<Flush> in_flight_;
  // ZeRO-3.
  std::optional<ParamShard> values_;
  struct Gathered {
    core::Tensor master, compute;  // the bucket's whole values (undefined: not gathered)
    std::vector<comm::WorkPtr> works;  // the all-gathers still to wait for
    bool bound = false;       // waited for and bound to the model's Param::value
    int holds = 0;            // units between their before- and after-event
    bool prefetched = false;  // started for a unit not yet begun
  };
  std::vector<Gathered> gathered_;  // per bucket
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
  int cold_gathers_ = 0;
  double waited_s_ = 0;  // this step's waits for reduce-scatters during the backward
  double exposed_grad_s_ = 0, exposed_gather_s_ = 0;
  int started_early_ = 0;
  // Hybrid sharding, this step: buckets (counted from the back) whose
  // replica all-reduce has started, those all-reduces, and how many of
  // them started during the backward.
  size_t next_replica_ = 0;
  std::vector<comm::WorkPtr> replica_works_;
  int replicas_started_early_ = 0;
};

}  // namespace loom::distributed

#endif  // LOOM_DISTRIBUTED_GRADIENT_SYNC_H_
