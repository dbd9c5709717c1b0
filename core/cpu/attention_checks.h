#ifndef LOOM_CORE_CPU_ATTENTION_CHECKS_H_
#define LOOM_CORE_CPU_ATTENTION_CHECKS_H_

// The CPU attention kernels' whole argument check: placement and dtype
// (f32 on the CPU), then the shared contract (core/ops/contracts/attention_checks.h).

#include "absl/status/statusor.h"
#include "core/ops/contracts/attention_checks.h"
#include "core/tensor.h"

namespace loom::core::cpu {

using ops::AttentionDims;
using ops::AttentionDropout;
using ops::AttentionSaved;

namespace internal {

// The CPU kernels' whole check: every tensor f32 on the CPU (outputs
// non-null), then the shapes above.
absl::StatusOr<AttentionDims> CheckCpuAttentionForward(const char* op, const Tensor& qkv,
                                                       int64_t heads, Tensor* out,
                                                       AttentionSaved kind, Tensor* saved,
                                                       const AttentionDropout& dropout);
absl::StatusOr<AttentionDims> CheckCpuAttentionBackward(
    const char* op, const Tensor& dout, const Tensor& qkv, const Tensor* out, AttentionSaved kind,
    const Tensor& saved, int64_t heads, Tensor* dqkv, const AttentionDropout& dropout);

}  // namespace internal
}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_ATTENTION_CHECKS_H_
