#include "core/cpu/flash_block.h"

#include <omp.h>

#include <cmath>
#include <cstring>

#include "core/cpu/check.h"
#include "core/cpu/flash_attention.h"
#include "core/ops/contracts/attention_checks.h"

namespace loom::core::cpu {
namespace {

using ops::FlashBlockDims;
using ops::FlashBlockOptions;

// Runs fn(pair) for every (batch, head) pair on OpenMP threads; the first error.
template <typename Fn>
absl::Status ForEachPair(int64_t pairs, Fn fn) {
  absl::Status first;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < pairs; ++p) {
    absl::Status s = fn(p);
    if (!s.ok()) {
#pragma omp critical(loom_flash_block_error)
      if (first.ok()) first = s;
    }
  }
  return first;
}

absl::Status CheckF32(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> in) {
  for (const auto& [name, t] : in) LOOM_RETURN_IF_ERROR(internal::CheckOutput(op, name, t));
  return absl::OkStatus();
}

// Every query of the block precedes every key: nothing to add.
bool FullyMasked(const FlashBlockOptions& o) {
  return o.causal && (o.q_len == 0 || o.k_start > o.q_start + o.q_len - 1);
}

// The block of `pair` (the ring's: pointers at the block's first rows).
FlashBlock PairBlock(const FlashBlockDims& g, const FlashBlockOptions& o, const float* qkv,
                     const float* kv, int64_t pair) {
  const int64_t total = o.dropout.total_heads > 0 ? o.dropout.total_heads : g.heads;
  FlashBlock blk;
  blk.d = g.d;
  blk.q = qkv + (o.q_row * g.b * g.heads + pair) * 3 * g.d;
  blk.ld_q = g.b * g.heads * 3 * g.d;
  blk.q_start = o.q_start;
  blk.q_len = o.q_len;
  blk.k = kv + (o.k_row * g.b * g.heads + pair) * 2 * g.d;
  blk.v = blk.k + g.d;
  blk.ld_kv = g.b * g.heads * 2 * g.d;
  blk.k_start = o.k_start;
  blk.k_len = o.k_len;
  blk.seq_len = o.seq_len;
  blk.global_pair = (pair / g.heads) * total + o.dropout.head_offset + pair % g.heads;
  blk.dropout = o.dropout;
  blk.causal = o.causal;
  if (o.dropout.doc_start != nullptr) {  // [b, seq_len] at global positions
    blk.q_doc_start = o.dropout.doc_start + (pair / g.heads) * o.seq_len + o.q_start;
  }
  return blk;
}

// The running state of `pair` from row `row`.
FlashRunning State(const FlashBlockDims& g, Tensor* acc, Tensor* max, Tensor* sum, int64_t pair,
                   int64_t row) {
  const int64_t first = pair * g.rows + row;
  return FlashRunning{acc->data<float>() + first * g.d, g.d, max->data<float>() + first,
                      sum->data<float>() + first};
}

}  // namespace

absl::Status FlashBlockInit(Tensor* acc, Tensor* max, Tensor* sum) {
  constexpr char kOp[] = "FlashBlockInit";
  LOOM_RETURN_IF_ERROR(CheckF32(kOp, {{"acc", acc}, {"max", max}, {"sum", sum}}));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashStateAlone(kOp, *acc, *max, *sum));
  return ForEachPair(g.b * g.heads, [&](int64_t pair) {
    FlashRunning st = State(g, acc, max, sum, pair, 0);
    FlashRunningInit(g.rows, g.d, &st);
    return absl::OkStatus();
  });
}

absl::Status FlashBlockForward(const Tensor& qkv, const Tensor& kv, const FlashBlockOptions& o,
                               Tensor* acc, Tensor* max, Tensor* sum) {
  constexpr char kOp[] = "FlashBlockForward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "qkv", qkv));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "kv", kv));
  LOOM_RETURN_IF_ERROR(CheckF32(kOp, {{"acc", acc}, {"max", max}, {"sum", sum}}));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashBlock(kOp, qkv, kv, o));
  LOOM_RETURN_IF_ERROR(ops::CheckFlashState(kOp, g, *acc, *max, *sum));
  if (FullyMasked(o) || o.k_len == 0) return absl::OkStatus();
  return ForEachPair(g.b * g.heads, [&](int64_t pair) {
    FlashRunning st = State(g, acc, max, sum, pair, o.q_row);
    return FlashForwardBlock(PairBlock(g, o, qkv.data<float>(), kv.data<float>(), pair), &st);
  });
}

absl::Status FlashBlockFinish(const Tensor& acc, const Tensor& max, const Tensor& sum,
                              Tensor* out, Tensor* lse) {
  constexpr char kOp[] = "FlashBlockFinish";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "acc", acc));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "max", max));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "sum", sum));
  LOOM_RETURN_IF_ERROR(CheckF32(kOp, {{"out", out}, {"lse", lse}}));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashStateAlone(kOp, acc, max, sum));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "out", *out, Shape{g.rows, g.b, g.heads * g.d}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "lse", *lse, Shape{g.b, g.heads, g.rows}));
  const int64_t ld_out = g.b * g.heads * g.d;
  return ForEachPair(g.b * g.heads, [&](int64_t pair) {
    const int64_t first = pair * g.rows;
    const FlashRunning st{const_cast<float*>(acc.data<float>()) + first * g.d, g.d,
                          const_cast<float*>(max.data<float>()) + first,
                          const_cast<float*>(sum.data<float>()) + first};
    FlashRunningFinish(g.rows, g.d, st, out->data<float>() + pair * g.d, ld_out,
                       lse->data<float>() + first);
    return absl::OkStatus();
  });
}

absl::Status FlashBlockDelta(const Tensor& dout, const Tensor& out, int64_t heads, Tensor* delta) {
  constexpr char kOp[] = "FlashBlockDelta";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckF32(kOp, {{"delta", delta}}));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "out", out, 3));
  if (heads <= 0 || out.dim(2) == 0 || out.dim(2) % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": out ", out.DebugString(),
                                                   " with heads=", heads,
                                                   ": last dim must be heads * head_dim"));
  }
  const int64_t rows = out.dim(0), b = out.dim(1), d = out.dim(2) / heads;
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dout", dout, out.shape()));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "delta", *delta, Shape{b, heads, rows}));
  const int64_t ld = b * heads * d;
  return ForEachPair(b * heads, [&](int64_t pair) {
    FlashDelta(rows, d, dout.data<float>() + pair * d, ld, out.data<float>() + pair * d, ld,
               delta->data<float>() + pair * rows);
    return absl::OkStatus();
  });
}

absl::Status FlashBlockBackward(const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                const Tensor& lse, const Tensor& delta,
                                const FlashBlockOptions& o, Tensor* dqkv, Tensor* dkv) {
  constexpr char kOp[] = "FlashBlockBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "qkv", qkv));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "kv", kv));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "lse", lse));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "delta", delta));
  LOOM_RETURN_IF_ERROR(CheckF32(kOp, {{"dqkv", dqkv}, {"dkv", dkv}}));
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashBlock(kOp, qkv, kv, o));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dout", dout, Shape{g.rows, g.b, g.heads * g.d}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "lse", lse, Shape{g.b, g.heads, g.rows}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "delta", delta, Shape{g.b, g.heads, g.rows}));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dqkv", *dqkv, qkv.shape()));
  LOOM_RETURN_IF_ERROR(ops::CheckShape(kOp, "dkv", *dkv, kv.shape()));
  if (FullyMasked(o) || o.k_len == 0) return absl::OkStatus();
  const int64_t ld_out = g.b * g.heads * g.d;
  return ForEachPair(g.b * g.heads, [&](int64_t pair) {
    const FlashBlock blk = PairBlock(g, o, qkv.data<float>(), kv.data<float>(), pair);
    FlashGrads grads;
    grads.dq = dqkv->data<float>() + (o.q_row * g.b * g.heads + pair) * 3 * g.d;
    grads.ld_dq = blk.ld_q;
    grads.dk = dkv->data<float>() + (o.k_row * g.b * g.heads + pair) * 2 * g.d;
    grads.dv = grads.dk + g.d;
    grads.ld_dkv = blk.ld_kv;
    const int64_t first = pair * g.rows + o.q_row;
    return FlashBackwardBlock(blk, dout.data<float>() + o.q_row * ld_out + pair * g.d, ld_out,
                              lse.data<float>() + first, delta.data<float>() + first, grads);
  });
}

namespace {

// Copies 2d floats per (row, pair) between the 3d-wide qkv rows (from
// element d) and the 2d-wide kv rows.
absl::Status CopyKv(const char* op, const char* qkv_name, const Tensor& qkv, int64_t heads,
                    const char* kv_name, const Tensor& kv, bool to_kv) {
  LOOM_ASSIGN_OR_RETURN(const FlashBlockDims g, ops::CheckFlashKv(op, qkv_name, qkv, heads, kv_name, kv));
  const int64_t n = g.rows * g.b * g.heads;
  float* q = const_cast<float*>(qkv.data<float>());
  float* k = const_cast<float*>(kv.data<float>());
#pragma omp parallel for
  for (int64_t r = 0; r < n; ++r) {
    float* a = q + r * 3 * g.d + g.d;
    float* c = k + r * 2 * g.d;
    if (to_kv) {
      std::memcpy(c, a, 2 * g.d * sizeof(float));
    } else {
      std::memcpy(a, c, 2 * g.d * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FlashKvPack(const Tensor& qkv, int64_t heads, Tensor* kv) {
  constexpr char kOp[] = "FlashKvPack";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "qkv", qkv));
  LOOM_RETURN_IF_ERROR(CheckF32(kOp, {{"kv", kv}}));
  return CopyKv(kOp, "qkv", qkv, heads, "kv", *kv, /*to_kv=*/true);
}

absl::Status FlashKvUnpack(const Tensor& dkv, int64_t heads, Tensor* dqkv) {
  constexpr char kOp[] = "FlashKvUnpack";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "dkv", dkv));
  LOOM_RETURN_IF_ERROR(CheckF32(kOp, {{"dqkv", dqkv}}));
  return CopyKv(kOp, "dqkv", *dqkv, heads, "dkv", dkv, /*to_kv=*/false);
}

}  // namespace loom::core::cpu
