#ifndef LOOM_CORE_CPU_ATTENTION_CHECKS_H_
#define LOOM_CORE_CPU_ATTENTION_CHECKS_H_

// The argument contracts of attention, in one place for all four kernels:
// the s x s kernel (attention.h), the flash kernel (flash_attention.h) and
// their CUDA twins (core/cuda/attention.h). The kernels differ only in what
// the forward keeps for the backward besides `out`, so a bad argument gets
// the same error from each. Every failure is an InvalidArgument naming the
// op, the argument and the expected shape. Internal to //core.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cpu/attention.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// The fused QKV activation [s, b, heads * 3 * d] of attention.
struct AttentionDims {
  int64_t s, b, heads, d;
};
absl::Status CheckQkv(const char* op, const Tensor& qkv, int64_t heads, AttentionDims* dims);

// What a forward keeps for its backward besides `out`.
enum class AttentionSaved {
  kProbs,  // the s x s kernel's "probs" [b, heads, s, s]
  kLse,    // the flash kernel's "lse" [b, heads, s]
};
const char* SavedName(AttentionSaved kind);
Shape SavedShape(AttentionSaved kind, const AttentionDims& g);

// Shapes only (dtypes and placement are each device's): qkv as CheckQkv, out
// [s, b, heads * d], `saved` of its kind's shape, then the dropout options.
absl::StatusOr<AttentionDims> CheckAttentionForwardShapes(const char* op, const Tensor& qkv,
                                                          int64_t heads, const Tensor& out,
                                                          AttentionSaved kind, const Tensor& saved,
                                                          const AttentionDropout& dropout);

// Shapes only: qkv as CheckQkv, dout [s, b, heads * d], out (the flash
// backward's input; null for the s x s kernel) [s, b, heads * d], `saved` of
// its kind's shape, dqkv qkv's shape, then the dropout options.
absl::StatusOr<AttentionDims> CheckAttentionBackwardShapes(
    const char* op, const Tensor& dout, const Tensor& qkv, const Tensor* out, AttentionSaved kind,
    const Tensor& saved, int64_t heads, const Tensor& dqkv, const AttentionDropout& dropout);

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
