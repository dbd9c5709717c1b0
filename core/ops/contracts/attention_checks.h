#ifndef LOOM_CORE_OPS_CONTRACTS_ATTENTION_CHECKS_H_
#define LOOM_CORE_OPS_CONTRACTS_ATTENTION_CHECKS_H_

// The argument contracts of causal attention, in one place for every
// implementation (the s x s kernels, the flash kernels, cuDNN's fused
// attention): they differ only in what the forward keeps for the backward
// besides `out`, so a bad argument gets the same error from each. Every
// failure is an InvalidArgument naming the op, the argument and the expected
// shape. Dtypes and placement are each device's.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::ops {

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

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_ATTENTION_CHECKS_H_
