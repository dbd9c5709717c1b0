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

// ---- The context-parallel ring's flash blocks (FlashBlockOptions) ----
// Shapes only, like the above. With rows the local rows of qkv [rows, b,
// heads * 3 * d]: kv [kv_rows, b, heads * 2 * d]; the running state acc
// [b, heads, rows, d], max and sum [b, heads, rows]; out and dout [rows, b,
// heads * d]; lse and delta [b, heads, rows]; dqkv qkv's shape; dkv kv's.
struct FlashBlockDims {
  int64_t rows, kv_rows, b, heads, d;
};
// The block's rows inside qkv and kv, its positions inside seq_len, the
// dropout options; qkv and kv of one b, heads and d.
absl::StatusOr<FlashBlockDims> CheckFlashBlock(const char* op, const Tensor& qkv,
                                               const Tensor& kv, const FlashBlockOptions& o);
// acc, max and sum of the state of `g.rows` rows.
absl::Status CheckFlashState(const char* op, const FlashBlockDims& g, const Tensor& acc,
                             const Tensor& max, const Tensor& sum);
// The state's dims from acc [b, heads, rows, d] (max and sum checked against it).
absl::StatusOr<FlashBlockDims> CheckFlashStateAlone(const char* op, const Tensor& acc,
                                                    const Tensor& max, const Tensor& sum);
// FlashKvPack's qkv [rows, b, heads * 3 * d] and kv [rows, b, heads * 2 * d]
// (either direction: `kv_name` is "kv" or "dkv", `qkv_name` "qkv" or "dqkv").
absl::StatusOr<FlashBlockDims> CheckFlashKv(const char* op, const char* qkv_name,
                                            const Tensor& qkv, int64_t heads,
                                            const char* kv_name, const Tensor& kv);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_CONTRACTS_ATTENTION_CHECKS_H_
