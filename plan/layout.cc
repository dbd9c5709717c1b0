#include "plan/layout.h"

#include <algorithm>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/enum_names.h"

namespace loom::plan {
namespace {

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

std::vector<int> DivisorsUpTo(int n, int max) {
  std::vector<int> d;
  for (int i : Divisors(n)) {
    if (i <= max) d.push_back(i);
  }
  return d;
}

// The ranks left after a factor of `d`; at least 1, so that a typed size that
// does not divide them still reaches Finalize, whose refusal names it.
int Rest(int n, int d) { return std::max(1, n / std::max(1, d)); }

bool Fixed(const SearchOptions& o, const char* flag) { return o.fixed.count(flag) > 0; }

// The values tried for one field: the typed one alone when the user fixed it.
template <typename T>
std::vector<T> Tried(const SearchOptions& o, const char* flag, T typed, std::vector<T> values) {
  if (Fixed(o, flag)) return {typed};
  return values;
}

using Sharding = train::ShardingStrategy;

// --num-distributed-optimizer-instances tried: 1, and where the gradient
// group (DP x CP) spans nodes, one instance a node (shard within the node,
// replicate across: hybrid sharding). TP fills a node first, as the time
// model places ranks, so a node holds devices_per_node / TP of the group
// (one rank a node: an instance would shard nothing).
std::vector<int> Instances(int dp, int cp, int tp, int devices_per_node, Sharding sharding) {
  std::vector<int> out = {1};
  const int group = dp * cp, on_node = devices_per_node / tp;
  if (sharding == Sharding::kNoShard || on_node < 2 || group <= on_node ||
      group % on_node != 0 || on_node % cp != 0) {
    return out;
  }
  if (const int n = group / on_node; dp % n == 0) out.push_back(n);
  return out;
}

// `c`'s strategy, typed (--data-parallel-sharding-strategy) or finalized.
Sharding ShardingOf(const train::TrainConfig& c) {
  if (c.data_parallel_sharding_strategy != Sharding::kUnset) {
    return c.data_parallel_sharding_strategy;
  }
  return c.optimizer.shard_params      ? Sharding::kOptimGradsParams
         : c.optimizer.shard_gradients ? Sharding::kOptimGrads
         : c.optimizer.distributed   ? Sharding::kOptim
                                     : Sharding::kNoShard;
}

void SetSharding(Sharding s, train::TrainConfig* c) {
  c->optimizer.distributed = s != Sharding::kNoShard;
  c->optimizer.shard_gradients = s == Sharding::kOptimGrads || s == Sharding::kOptimGradsParams;
  c->optimizer.shard_params = s == Sharding::kOptimGradsParams;
  // Finalize reads the strategy from here.
  c->data_parallel_sharding_strategy = s;
  if (s == Sharding::kNoShard) c->overlap_param_gather = false;
}

struct Recompute {
  layers::RecomputeGranularity granularity;
  layers::RecomputeMethod method;
  int64_t layers;
};

// None, selective and full (uniform 1), each with the typed recompute fields
// in place of its own (so --recompute-method=block alone tries full block 1).
std::vector<Recompute> Recomputes(const train::TrainConfig& base, const SearchOptions& o) {
  using G = layers::RecomputeGranularity;
  using M = layers::RecomputeMethod;
  std::vector<Recompute> tried = {{G::kNone, M::kNone, 0}};
  if (o.try_recompute) {
    tried.push_back({G::kSelective, M::kNone, 0});
    tried.push_back({G::kFull, M::kUniform, 1});
  }
  std::vector<Recompute> out;
  for (Recompute r : tried) {
    if (Fixed(o, "recompute_granularity")) r.granularity = base.model.recompute_granularity;
    if (Fixed(o, "recompute_method")) r.method = base.model.recompute_method;
    if (Fixed(o, "recompute_num_layers")) r.layers = base.model.recompute_num_layers;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const Recompute& x) {
      return x.granularity == r.granularity && x.method == r.method && x.layers == r.layers;
    });
    if (!seen) out.push_back(std::move(r));
  }
  return out;
}

// 1, 2, 4, ... up to the maximum, while they divide the global batch over DP.
std::vector<int64_t> MicroBatches(const train::TrainConfig& base, const SearchOptions& o, int dp) {
  std::vector<int64_t> out;
  for (int64_t mbs = 1; mbs <= o.max_micro_batch; mbs *= 2) {
    if (base.global_batch_size % (mbs * dp) != 0) break;
    out.push_back(mbs);
  }
  return out;
}

}  // namespace

const std::vector<std::string>& LayoutFlagNames() {
  static const auto* names = new std::vector<std::string>{
      "tensor_model_parallel_size",
      "pipeline_model_parallel_size",
      "num_layers_per_virtual_pipeline_stage",
      "pipeline_schedule",
      "context_parallel_size",
      "expert_model_parallel_size",
      "sequence_parallel",
      "micro_batch_size",
      "recompute_granularity",
      "recompute_method",
      "recompute_num_layers",
      "use_distributed_optimizer",
      "data_parallel_sharding_strategy",
      "num_distributed_optimizer_instances",
  };
  return *names;
}

std::set<std::string> TypedLayoutFlags(const std::vector<std::string>& typed) {
  std::set<std::string> out;
  for (const std::string& name : LayoutFlagNames()) {
    for (const std::string& t : typed) {
      if (t == name || t == absl::StrCat("no", name)) out.insert(name);
    }
  }
  return out;
}

std::string FixedFlags(const train::TrainConfig& c, const std::set<std::string>& fixed) {
  const std::map<std::string, std::string> values = {
      {"tensor_model_parallel_size", absl::StrCat(c.tensor_model_parallel_size)},
      {"pipeline_model_parallel_size", absl::StrCat(c.pipeline_model_parallel_size)},
      {"num_layers_per_virtual_pipeline_stage",
       absl::StrCat(c.num_layers_per_virtual_pipeline_stage)},
      {"pipeline_schedule", std::string(core::EnumName(c.pipeline_schedule))},
      {"context_parallel_size", absl::StrCat(c.context_parallel_size)},
      {"expert_model_parallel_size", absl::StrCat(c.expert_model_parallel_size)},
      {"micro_batch_size", absl::StrCat(c.micro_batch_size)},
      {"recompute_granularity", std::string(core::EnumName(c.model.recompute_granularity))},
      {"recompute_method", std::string(core::EnumName(c.model.recompute_method))},
      {"recompute_num_layers", absl::StrCat(c.model.recompute_num_layers)},
      {"data_parallel_sharding_strategy",
       std::string(core::EnumName(c.data_parallel_sharding_strategy))},
      {"num_distributed_optimizer_instances", absl::StrCat(c.num_distributed_optimizer_instances)},
  };
  const std::map<std::string, bool> switches = {
      {"sequence_parallel", c.sequence_parallel},
      {"use_distributed_optimizer", c.optimizer.distributed},
  };
  std::vector<std::string> out;
  for (const std::string& name : LayoutFlagNames()) {
    if (!fixed.count(name)) continue;
    const std::string dashed = absl::StrReplaceAll(name, {{"_", "-"}});
    if (auto it = switches.find(name); it != switches.end()) {
      out.push_back(absl::StrCat(it->second ? "--" : "--no", dashed));
    } else {
      out.push_back(absl::StrCat("--", dashed, "=", values.at(name)));
    }
  }
  return absl::StrJoin(out, " ");
}

std::vector<train::TrainConfig> EnumerateLayouts(const train::TrainConfig& base,
                                                 const SearchOptions& o, int* rejected,
                                                 std::string* first_error) {
  std::vector<train::TrainConfig> out;
  int refused = 0;
  const int max_tp = o.max_tp > 0 ? o.max_tp : o.devices_per_node;
  const std::vector<Recompute> recomputes = Recomputes(base, o);
  const int64_t layers = base.model.num_layers;
  // Only the interleaved schedule runs more than one chunk per stage.
  const bool interleave = o.try_interleaving && (!Fixed(o, "pipeline_schedule") ||
                                                 base.pipeline_schedule ==
                                                     pipeline::ScheduleKind::kInterleaved);
  const std::string typed = FixedFlags(base, o.fixed);
  // A candidate is kept when the trainer accepts it as it is.
  auto keep_if_valid = [&](train::TrainConfig c) {
    absl::Status s = train::Finalize(&c, o.gpus);
    // Finalize may rewrite a field (SP off at TP 1, 1f1b to interleaved):
    // then the layout lacks what was typed.
    if (s.ok() && FixedFlags(c, o.fixed) != typed) {
      s = absl::InvalidArgumentError(
          absl::StrCat("the trainer runs it as ", FixedFlags(c, o.fixed), ", not ", typed));
    }
    if (s.ok()) {
      out.push_back(std::move(c));
      return;
    }
    if (first_error != nullptr && first_error->empty()) {
      *first_error = absl::StrCat(DescribeLayout(c), ": ", s.message());
    }
    ++refused;
  };
  for (int tp : Tried(o, "tensor_model_parallel_size", base.tensor_model_parallel_size,
                      DivisorsUpTo(o.gpus, max_tp))) {
    for (int cp : Tried(o, "context_parallel_size", base.context_parallel_size,
                        DivisorsUpTo(Rest(o.gpus, tp), o.max_cp))) {
      std::vector<int> pps;
      for (int pp : Divisors(Rest(o.gpus, tp * cp))) {
        if (layers % pp == 0) pps.push_back(pp);
      }
      for (int pp :
           Tried(o, "pipeline_model_parallel_size", base.pipeline_model_parallel_size, pps)) {
        const int dp = Rest(o.gpus, tp * cp * pp);
        // Layers per virtual stage: 0 (no interleaving) and every divisor of
        // the stage's layers giving >= 2 chunks.
        std::vector<int> per_chunk = {0};
        if (pp > 1 && interleave) {
          for (int64_t per = layers / pp / 2; per >= 1; --per) {
            if ((layers / pp) % per == 0) per_chunk.push_back(static_cast<int>(per));
          }
        }
        std::vector<int> eps = {1};
        if (base.model.moe()) {
          eps.clear();
          for (int ep : Divisors(dp)) {
            if (base.model.num_experts % ep == 0) eps.push_back(ep);
          }
        }
        std::vector<bool> sps = {false};
        if (tp > 1 && o.try_sequence_parallel) sps.push_back(true);
        // The sharding strategy: no_shard, optim (ZeRO-1), optim_grads (ZeRO-2),
        // optim_grads_params (ZeRO-3; Finalize refuses it where it does not run).
        std::vector<Sharding> shardings = {Sharding::kNoShard};
        if (dp * cp > 1 && o.try_distributed_optimizer) {
          shardings.push_back(Sharding::kOptim);
          shardings.push_back(Sharding::kOptimGrads);
          shardings.push_back(Sharding::kOptimGradsParams);
        }
        if (Fixed(o, "data_parallel_sharding_strategy")) shardings = {ShardingOf(base)};
        for (int per : Tried(o, "num_layers_per_virtual_pipeline_stage",
                             base.num_layers_per_virtual_pipeline_stage, per_chunk)) {
          for (int ep :
               Tried(o, "expert_model_parallel_size", base.expert_model_parallel_size, eps)) {
            for (bool sp : Tried(o, "sequence_parallel", base.sequence_parallel, sps)) {
              for (int64_t mbs :
                   Tried(o, "micro_batch_size", base.micro_batch_size, MicroBatches(base, o, dp))) {
                for (const Recompute& r : recomputes) {
                  for (Sharding sharding :
                       Tried(o, "use_distributed_optimizer", ShardingOf(base), shardings)) {
                    for (int instances :
                         Tried(o, "num_distributed_optimizer_instances",
                               base.num_distributed_optimizer_instances,
                               Instances(dp, cp, tp, o.devices_per_node, sharding))) {
                      train::TrainConfig c = base;
                      c.tensor_model_parallel_size = tp;
                      c.pipeline_model_parallel_size = pp;
                      c.context_parallel_size = cp;
                      c.expert_model_parallel_size = ep;
                      c.num_layers_per_virtual_pipeline_stage = per;
                      if (!Fixed(o, "pipeline_schedule")) {
                        c.pipeline_schedule = pipeline::ScheduleKind::k1F1B;
                      }
                      c.sequence_parallel = sp;
                      c.micro_batch_size = mbs;
                      c.model.recompute_granularity = r.granularity;
                      c.model.recompute_method = r.method;
                      c.model.recompute_num_layers = r.layers;
                      SetSharding(sharding, &c);
                      c.num_distributed_optimizer_instances = instances;
                      keep_if_valid(std::move(c));
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  if (rejected != nullptr) *rejected = refused;
  return out;
}

std::string DescribeLayout(const train::TrainConfig& c) {
  std::string s = absl::StrCat("TP ", c.tensor_model_parallel_size, " PP ",
                               c.pipeline_model_parallel_size);
  if (c.virtual_pipeline_size > 1) absl::StrAppend(&s, " VP ", c.virtual_pipeline_size);
  if (c.context_parallel_size > 1) absl::StrAppend(&s, " CP ", c.context_parallel_size);
  absl::StrAppend(&s, " DP ", c.data_parallel_size);
  if (c.expert_model_parallel_size > 1) absl::StrAppend(&s, " EP ", c.expert_model_parallel_size);
  if (c.sequence_parallel) absl::StrAppend(&s, " SP");
  absl::StrAppend(&s, " mbs ", c.micro_batch_size);
  if (c.model.recompute_granularity != layers::RecomputeGranularity::kNone) {
    absl::StrAppend(&s, " rc ", core::EnumName(c.model.recompute_granularity));
  }
  if (c.optimizer.shard_params) {
    absl::StrAppend(&s, " optim_grads_params");
  } else if (c.optimizer.shard_gradients) {
    absl::StrAppend(&s, " optim_grads");
  } else if (c.optimizer.distributed) {
    absl::StrAppend(&s, " dist-opt");
  }
  if (c.num_distributed_optimizer_instances > 1) {
    absl::StrAppend(&s, " x", c.num_distributed_optimizer_instances, " instances");
  }
  return s;
}

std::string LayoutFlags(const train::TrainConfig& c) {
  std::string s = absl::StrCat("--tensor-model-parallel-size=", c.tensor_model_parallel_size,
                               " --pipeline-model-parallel-size=", c.pipeline_model_parallel_size);
  if (c.num_layers_per_virtual_pipeline_stage > 0) {
    absl::StrAppend(&s, " --num-layers-per-virtual-pipeline-stage=",
                    c.num_layers_per_virtual_pipeline_stage);
  }
  if (c.context_parallel_size > 1) {
    absl::StrAppend(&s, " --context-parallel-size=", c.context_parallel_size);
  }
  if (c.expert_model_parallel_size > 1) {
    absl::StrAppend(&s, " --expert-model-parallel-size=", c.expert_model_parallel_size);
  }
  if (c.sequence_parallel) absl::StrAppend(&s, " --sequence-parallel");
  absl::StrAppend(&s, " --micro-batch-size=", c.micro_batch_size);
  if (c.model.recompute_granularity != layers::RecomputeGranularity::kNone) {
    absl::StrAppend(&s, " --recompute-granularity=", core::EnumName(c.model.recompute_granularity));
    if (c.model.recompute_method != layers::RecomputeMethod::kNone) {
      absl::StrAppend(&s, " --recompute-method=", core::EnumName(c.model.recompute_method),
                      " --recompute-num-layers=", c.model.recompute_num_layers);
    }
  }
  if (c.optimizer.shard_params) {
    absl::StrAppend(&s, " --data-parallel-sharding-strategy=optim_grads_params");
  } else if (c.optimizer.shard_gradients) {
    absl::StrAppend(&s, " --data-parallel-sharding-strategy=optim_grads");
  } else if (c.optimizer.distributed) {
    absl::StrAppend(&s, " --use-distributed-optimizer");
  }
  if (c.num_distributed_optimizer_instances > 1) {
    absl::StrAppend(&s, " --num-distributed-optimizer-instances=",
                    c.num_distributed_optimizer_instances);
  }
  return s;
}

}  // namespace loom::plan
