#include "plan/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::plan {
namespace {

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

struct Recompute {
  const char* granularity;
  const char* method;
  int64_t layers;
};

}  // namespace

std::vector<train::TrainConfig> EnumerateLayouts(const train::TrainConfig& base,
                                                 const SearchOptions& o, int* rejected,
                                                 std::string* first_error) {
  std::vector<train::TrainConfig> out;
  int refused = 0;
  const int max_tp = o.max_tp > 0 ? o.max_tp : o.devices_per_node;
  std::vector<Recompute> recomputes = {{"", "", 0}};
  if (o.try_recompute) {
    recomputes.push_back({"selective", "", 0});
    recomputes.push_back({"full", "uniform", 1});
  }
  const int64_t layers = base.model.num_layers;
  for (int tp : Divisors(o.gpus)) {
    if (tp > max_tp) continue;
    for (int cp : Divisors(o.gpus / tp)) {
      if (cp > o.max_cp) continue;
      for (int pp : Divisors(o.gpus / (tp * cp))) {
        if (layers % pp != 0) continue;
        const int dp = o.gpus / (tp * cp * pp);
        // Layers per virtual stage: 0 (no interleaving) and every divisor of
        // the stage's layers giving >= 2 chunks.
        std::vector<int64_t> per_chunk = {0};
        if (pp > 1 && o.try_interleaving) {
          for (int64_t per = layers / pp / 2; per >= 1; --per) {
            if ((layers / pp) % per == 0) per_chunk.push_back(per);
          }
        }
        std::vector<int> eps = {1};
        if (base.model.moe()) {
          eps.clear();
          for (int ep : Divisors(dp)) {
            if (base.model.num_experts % ep == 0) eps.push_back(ep);
          }
        }
        for (int64_t per : per_chunk) {
          for (int ep : eps) {
            for (bool sp : {false, true}) {
              if (sp && (tp == 1 || !o.try_sequence_parallel)) continue;
              for (int64_t mbs = 1; mbs <= o.max_micro_batch; mbs *= 2) {
                if (base.global_batch_size % (mbs * dp) != 0) break;
                for (const Recompute& r : recomputes) {
                  for (bool dist : {false, true}) {
                    if (dist && (dp * cp == 1 || !o.try_distributed_optimizer)) continue;
                    train::TrainConfig c = base;
                    c.tensor_model_parallel_size = tp;
                    c.pipeline_model_parallel_size = pp;
                    c.context_parallel_size = cp;
                    c.expert_model_parallel_size = ep;
                    c.num_layers_per_virtual_pipeline_stage = static_cast<int>(per);
                    c.pipeline_schedule = "1f1b";
                    c.sequence_parallel = sp;
                    c.micro_batch_size = mbs;
                    c.model.recompute_granularity = r.granularity;
                    c.model.recompute_method = r.method;
                    c.model.recompute_num_layers = r.layers;
                    c.optimizer.distributed = dist;
                    if (!dist) c.overlap_param_gather = false;
                    if (absl::Status s = train::Finalize(&c, o.gpus); !s.ok()) {
                      if (first_error != nullptr && first_error->empty()) {
                        *first_error = absl::StrCat(DescribeLayout(c), ": ", s.message());
                      }
                      ++refused;
                      continue;
                    }
                    out.push_back(std::move(c));
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
  if (!c.model.recompute_granularity.empty()) {
    absl::StrAppend(&s, " rc ", c.model.recompute_granularity);
  }
  if (c.optimizer.distributed) absl::StrAppend(&s, " dist-opt");
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
  if (!c.model.recompute_granularity.empty()) {
    absl::StrAppend(&s, " --recompute-granularity=", c.model.recompute_granularity);
    if (!c.model.recompute_method.empty()) {
      absl::StrAppend(&s, " --recompute-method=", c.model.recompute_method,
                      " --recompute-num-layers=", c.model.recompute_num_layers);
    }
  }
  if (c.optimizer.distributed) absl::StrAppend(&s, " --use-distributed-optimizer");
  return s;
}

}  // namespace loom::plan
