#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "config/finalize.h"
#include "core/enum_names.h"

namespace loom::train::finalize {
namespace {

// Megatron's --data-parallel-sharding-strategy (parsed by its flag) into the
// optimizer's three switches; --use-distributed-optimizer stays an alias of `optim`.
absl::Status ShardingStrategy(TrainConfig* c) {
  using S = train::ShardingStrategy;
  const S s = c->data_parallel_sharding_strategy;
  OptimizerConfig& o = c->optimizer;
  if (s == S::kUnset) return absl::OkStatus();  // --use-distributed-optimizer alone decides
  o.shard_params = false;
  switch (s) {
    case S::kUnset:
      break;
    case S::kNoShard:
      if (o.distributed) {
        return absl::InvalidArgumentError(
            "--use-distributed-optimizer shards the optimizer state, "
            "--data-parallel-sharding-strategy=no_shard shards nothing: give one of them (optim "
            "is --use-distributed-optimizer's strategy)");
      }
      o.shard_gradients = false;
      break;
    case S::kOptim:
      o.distributed = true;
      o.shard_gradients = false;
      break;
    case S::kOptimGrads:
    case S::kOptimGradsParams:
      o.distributed = true;
      o.shard_gradients = true;
      o.shard_params = s == S::kOptimGradsParams;
      break;
  }
  if (o.shard_params && !c->model.device.is_cpu() && !c->allow_unproven_gpu_sharding) {
    // ZeRO-3 on a device is proven on the fake device only (//train:sharded_device_test),
    // not yet by a GPU run: refused before any work unless asked for.
    return absl::UnimplementedError(
        "--data-parallel-sharding-strategy=optim_grads_params with --device=cuda has not been "
        "proven by a GPU run yet (only on the fake device of the tests): pass "
        "--allow-unproven-gpu-sharding to run it, or use optim_grads (ZeRO-2)");
  }
  return absl::OkStatus();
}

// Megatron's --num-distributed-optimizer-instances (hybrid sharding): the DP
// group splits into N instances; the strategy shards within each.
absl::Status DistributedOptimizerInstances(const TrainConfig& c) {
  const int n = c.num_distributed_optimizer_instances;
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-distributed-optimizer-instances (", n, ") must be >= 1"));
  }
  if (n == 1) return absl::OkStatus();
  if (!c.optimizer.distributed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances=", n,
        " shards within instances, but --data-parallel-sharding-strategy=no_shard shards "
        "nothing: give optim, optim_grads or optim_grads_params (or --use-distributed-optimizer)"));
  }
  if (c.data_parallel_size % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances (", n, ") does not divide the data-parallel size (",
        c.data_parallel_size, " = world ", c.world_size, " / (--tensor-model-parallel-size ",
        c.tensor_model_parallel_size, " x --pipeline-model-parallel-size ",
        c.pipeline_model_parallel_size, " x --context-parallel-size ", c.context_parallel_size,
        ")): each instance holds DP / N ranks"));
  }
  if (const int ep = c.expert_model_parallel_size; (c.data_parallel_size / n) % ep != 0) {
    // Each instance holds whole EP groups: every expert, and its replicas
    // spread evenly over the instances.
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances (", n, "): the data-parallel ranks of an "
        "instance (DP ", c.data_parallel_size, " / ", n, " = ", c.data_parallel_size / n,
        ") must be a multiple of --expert-model-parallel-size (", ep, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Optimizer(TrainConfig* c) {
  // --skip-train takes no step: --train-iters=0 is then what it says (Megatron's spelling).
  if (c->train_iters < (c->skip_train ? 0 : 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--train-iters (", c->train_iters, ") must be >= 1",
                     c->skip_train ? "" : " (0 only with --skip-train)"));
  }
  if (absl::Status s = ShardingStrategy(c); !s.ok()) return s;
  if (absl::Status s = DistributedOptimizerInstances(*c); !s.ok()) return s;
  if (c->lr.decay_iters == 0) c->lr.decay_iters = c->train_iters;
  if (c->lr.warmup_iters < 0) c->lr.warmup_iters = std::min<int64_t>(20, c->train_iters / 10);
  absl::Status lr = c->lr.Validate();
  if (!lr.ok()) return lr;
  if (c->hidden_dropout < 0 || c->hidden_dropout >= 1 || c->attention_dropout < 0 ||
      c->attention_dropout >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("--hidden-dropout (", c->hidden_dropout,
                                                   ") and --attention-dropout (",
                                                   c->attention_dropout, ") must lie in [0, 1)"));
  }
  if (c->optimizer.clip_grad < 0 || c->optimizer.weight_decay < 0 || c->optimizer.eps <= 0 ||
      c->optimizer.beta1 < 0 || c->optimizer.beta1 >= 1 || c->optimizer.beta2 < 0 ||
      c->optimizer.beta2 >= 1) {
    return absl::InvalidArgumentError(
        "--clip-grad and --weight-decay must be >= 0, --adam-eps > 0, --adam-beta1/2 in [0, 1)");
  }
  return absl::OkStatus();
}

absl::Status GradientReduction(const TrainConfig& c) {
  if (c.optimizer.bucket_bytes < 4) {
    return absl::InvalidArgumentError(absl::StrCat("--ddp-bucket-size (", c.optimizer.bucket_bytes / 4,
                                                   ") must be >= 1 parameter"));
  }
  if (c.overlap_param_gather && !c.optimizer.distributed) {
    return absl::InvalidArgumentError(
        "--overlap-param-gather needs --use-distributed-optimizer (without it every rank updates "
        "all parameters and nothing is gathered)");
  }
  return absl::OkStatus();
}

}  // namespace loom::train::finalize
