#ifndef LOOM_CONFIG_OPTIMIZER_CONFIG_H_
#define LOOM_CONFIG_OPTIMIZER_CONFIG_H_

#include <cstdint>

namespace loom::train {

// AdamW's settings, apart from the optimizer (train/optimizer.h), so the
// configuration and the planner need not link it.
struct OptimizerConfig {
  float beta1 = 0.9f;         // --adam-beta1
  float beta2 = 0.999f;       // --adam-beta2
  float eps = 1e-8f;          // --adam-eps
  float weight_decay = 0.01f; // --weight-decay (not applied to biases and LayerNorm)
  float clip_grad = 1.0f;     // --clip-grad (0: no clipping)
  // Megatron's --data-parallel-sharding-strategy: no_shard (both false),
  // optim (ZeRO-1: `distributed`, also --use-distributed-optimizer) or
  // optim_grads (ZeRO-2: both) or optim_grads_params (ZeRO-3: all three).
  bool distributed = false;      // Adam state (and the update) sharded over DP
  bool shard_gradients = false;  // only the owned shard of the gradients is kept
  bool shard_params = false;     // only the owned shard of the parameters is kept
  int64_t bucket_bytes = 4 << 20;  // data-parallel gradient buckets (GradientSync)
};

}  // namespace loom::train

#endif  // LOOM_CONFIG_OPTIMIZER_CONFIG_H_
