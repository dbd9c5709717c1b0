#ifndef LOOM_CORE_OPS_ATTENTION_PLAN_H_
#define LOOM_CORE_OPS_ATTENTION_PLAN_H_

// The layers' causal attention through the implementation the kernel
// manifest picks for the device (kernel_choice.h): "sxs" (the s x s kernel,
// keeps the probabilities), "flash" (keeps the log-sum-exp per row), or a
// device library's variant on the flash contract (cuDNN's fused attention).
// A variant that cannot run a call (cuDNN: f32, attention dropout, libcudnn
// not loadable) runs the device's reference instead, said once on stderr.
// The forward and the backward of one call must use the same plan: the
// caller keeps it with what the forward saved.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/ops/contracts/attention_checks.h"
#include "core/ops/kernel_table.h"
#include "core/tensor.h"

namespace loom::core::ops {

struct AttentionPlan {
  std::string implementation;  // "sxs", "flash", "cudnn"
  // What the forward keeps besides `out`: probs [b, heads, s, s] in qkv's
  // dtype, or lse [b, heads, s] f32 (SavedShape in attention_checks.h).
  AttentionSaved saved = AttentionSaved::kLse;
};

absl::StatusOr<AttentionPlan> PlanAttention(const Tensor& qkv, int64_t heads,
                                            const AttentionDropout& dropout);

// The saved tensor of `plan` for this qkv (uninitialised).
absl::StatusOr<Tensor> EmptySaved(const AttentionPlan& plan, const Tensor& qkv, int64_t heads);

absl::Status PlannedAttentionForward(const AttentionPlan& plan, const Tensor& qkv, int64_t heads,
                                     Tensor* out, Tensor* saved, const AttentionDropout& dropout);
// `out` is the forward's (read by the lse-contract kernels only).
absl::Status PlannedAttentionBackward(const AttentionPlan& plan, const Tensor& dout,
                                      const Tensor& qkv, const Tensor& out, const Tensor& saved,
                                      int64_t heads, Tensor* dqkv,
                                      const AttentionDropout& dropout);

// A device library's attention on the flash contract beyond its table's
// kernels, registered at static initialisation (//core/cuda:ops: cuDNN).
struct AttentionVariant {
  const char* name = "";
  // OK when this call can run; otherwise why not (Unimplemented,
  // FailedPrecondition), checked before any device work.
  absl::Status (*supports)(const Tensor& qkv, int64_t heads, const AttentionDropout& dropout) =
      nullptr;
  decltype(KernelTable::flash_attention_forward) forward = nullptr;
  decltype(KernelTable::flash_attention_backward) backward = nullptr;
};
// Kept, not copied; `variant` must outlive the process.
void RegisterAttentionVariant(DeviceType type, const AttentionVariant* variant);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_ATTENTION_PLAN_H_
