#ifndef LOOM_CORE_CPU_FLASH_BLOCK_H_
#define LOOM_CORE_CPU_FLASH_BLOCK_H_

// The context-parallel ring's flash attention as tensor ops (the FlashBlock*
// and FlashKv* lines of core/ops/contracts/op_list.h), so the ring runs on
// whatever device its tensors are on. On the CPU each is a loop over the
// (batch, head) pairs (OpenMP) of core/cpu/flash_attention.h's block API, so
// a ring built from them is bitwise the ring that called the block API itself.
//
// Tensors (rows: this rank's local rows; host f32 here):
//   qkv   [rows, b, heads * 3 * d]     Q read from its q slots
//   kv    [kv_rows, b, heads * 2 * d]  K and V packed per (row, pair): what travels the ring
//   acc   [b, heads, rows, d]          running sum_j keep_ij exp(s_ij - m_i) v_j
//   max   [b, heads, rows]             running row max (-inf: no key yet)
//   sum   [b, heads, rows]             running sum_j exp(s_ij - m_i), before dropout
//   out, dout [rows, b, heads * d];  lse, delta [b, heads, rows] (f32 always)
//   dqkv  f32, qkv's shape: dQ accumulates in its q slots (k, v slots untouched)
//   dkv   f32, kv's shape: dK, dV accumulate
// FlashBlockOptions (core/ops/contracts/options.h) name the block's rows and
// global positions; a causal block whose keys all follow its queries is a no-op.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cpu {

// acc = 0, max = -inf, sum = 0.
absl::Status FlashBlockInit(Tensor* acc, Tensor* max, Tensor* sum);

// Adds the K/V block to the running state of the Q block (FlashForwardBlock).
absl::Status FlashBlockForward(const Tensor& qkv, const Tensor& kv,
                               const ops::FlashBlockOptions& o, Tensor* acc, Tensor* max,
                               Tensor* sum);

// out = acc / sum, lse = max + log(sum); a row that saw no key: 0 and -inf.
absl::Status FlashBlockFinish(const Tensor& acc, const Tensor& max, const Tensor& sum,
                              Tensor* out, Tensor* lse);

// delta = rowsum(dout * out) per (pair, row): the FINAL out.
absl::Status FlashBlockDelta(const Tensor& dout, const Tensor& out, int64_t heads, Tensor* delta);

// dQ += and dK, dV += the block's parts (FlashBackwardBlock), with the final
// lse and delta.
absl::Status FlashBlockBackward(const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                const Tensor& lse, const Tensor& delta,
                                const ops::FlashBlockOptions& o, Tensor* dqkv, Tensor* dkv);

// kv = qkv's k and v slots (every row); dqkv's k and v slots = dkv (its q
// slots untouched). Same dtype on both sides.
absl::Status FlashKvPack(const Tensor& qkv, int64_t heads, Tensor* kv);
absl::Status FlashKvUnpack(const Tensor& dkv, int64_t heads, Tensor* dqkv);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_FLASH_BLOCK_H_
