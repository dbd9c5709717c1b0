#include "core/cpu/flash_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/attention_checks.h"
#include "core/cpu/check.h"
#include "core/cpu/dropout.h"
#include "core/cpu/matmul.h"
#include "core/cpu/philox.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

using internal::ExpF;

// Tile sizes: a query tile of kTileQ rows meets key tiles of kTileK rows; the
// per-thread tiles (scores, dP, dropped P: kTileQ x kTileK floats each) stay
// in L2. The block GEMMs go to oneDNN (single-threaded inside our threads).
constexpr int64_t kTileQ = 128;
constexpr int64_t kTileK = 256;

constexpr float kNegInf = -INFINITY;

// Per-thread tiles of the block functions.
struct Tiles {
  std::vector<float> s, dp, pd;
  std::vector<uint32_t> bits;
};
Tiles& ThreadTiles() {
  thread_local Tiles t;
  if (t.s.empty()) {
    t.s.resize(kTileQ * kTileK);
    t.dp.resize(kTileQ * kTileK);
    t.pd.resize(kTileQ * kTileK);
    t.bits.resize(kTileK);
  }
  return t;
}

// row[j] = exp(row[j] - shift) for j < n; *sum = their sum.
LOOM_CPU_INLINE void ExpShiftRowBody(float* row, int64_t n, float shift, float* sum) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] = ExpF(row[j] - shift);
  *sum = internal::SumOf(n, [&](int64_t j) { return row[j]; });
}
LOOM_CPU_MULTIVERSION(ExpShiftRow, (float* row, int64_t n, float shift, float* sum),
                      (row, n, shift, sum))

// One backward row of a tile, n live columns: s_row holds the scores and
// becomes P = exp(s - lse); dp_row holds dP = dO·Vᵀ and becomes
// dS = P (dP' - delta), where dP' = dP keep / (1 - p) with dropout; pd_row
// (with dropout) becomes the dropped P (keep / (1 - p) P).
LOOM_CPU_INLINE void BackwardRowBody(float* s_row, float* dp_row, float* pd_row,
                                     const uint32_t* bits, uint32_t threshold, float keep_scale,
                                     int64_t n, float lse, float delta) {
  if (pd_row == nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float p = ExpF(s_row[j] - lse);
      s_row[j] = p;
      dp_row[j] = p * (dp_row[j] - delta);
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float p = ExpF(s_row[j] - lse);
      const bool keep = bits[j] >= threshold;
      s_row[j] = p;
      pd_row[j] = keep ? p * keep_scale : 0.0f;
      dp_row[j] = p * ((keep ? dp_row[j] * keep_scale : 0.0f) - delta);
    }
  }
}
LOOM_CPU_MULTIVERSION(BackwardRow,
                      (float* s_row, float* dp_row, float* pd_row, const uint32_t* bits,
                       uint32_t threshold, float keep_scale, int64_t n, float lse, float delta),
                      (s_row, dp_row, pd_row, bits, threshold, keep_scale, n, lse, delta))

// Live columns of global query row gi in the key tile starting at global k_first.
inline int64_t LiveColumns(const FlashBlock& b, int64_t gi, int64_t k_first, int64_t tk) {
  if (!b.causal) return tk;
  return std::clamp<int64_t>(gi - k_first + 1, 0, tk);
}

// Visible columns [lo, hi) of block row r (global query b.q_start + r) in
// the key tile of tk keys from global k_first: causal, and with packed
// documents not before the row's document start.
struct Columns {
  int64_t lo = 0, hi = 0;
};
inline Columns VisibleColumns(const FlashBlock& b, int64_t r, int64_t k_first, int64_t tk) {
  Columns c{0, LiveColumns(b, b.q_start + r, k_first, tk)};
  if (b.q_doc_start != nullptr) {
    c.lo = std::clamp<int64_t>(b.q_doc_start[r] - k_first, 0, tk);
    c.hi = std::max(c.hi, c.lo);
  }
  return c;
}

// The earliest document start of block rows [r0, r0 + n) (no documents: 0):
// a key tile that ends before it is invisible to all of them.
inline int64_t FirstDocStart(const FlashBlock& b, int64_t r0, int64_t n) {
  if (b.q_doc_start == nullptr) return 0;
  return *std::min_element(b.q_doc_start + r0, b.q_doc_start + r0 + n);
}

// Global dropout index of element (query gi, key 0) of the block's pair.
inline uint64_t RowIndex(const FlashBlock& b, int64_t gi) {
  return (static_cast<uint64_t>(b.global_pair) * static_cast<uint64_t>(b.seq_len) +
          static_cast<uint64_t>(gi)) *
         static_cast<uint64_t>(b.seq_len);
}

float KeepScale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

// Runs fn(item) for item in [0, n) over OpenMP threads (dynamic), returning
// the first error.
template <typename Fn>
absl::Status ParallelItems(int64_t n, Fn fn) {
  absl::Status first_error;
#pragma omp parallel if (n > 1)
  {
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < n; ++t) {
      absl::Status s = fn(t);
      if (!s.ok()) {
#pragma omp critical
        if (first_error.ok()) first_error = s;
      }
    }
  }
  return first_error;
}

}  // namespace

// ---------------------------------------------------------------- blocks ----

void FlashRunningInit(int64_t q_len, int64_t d, FlashRunning* st) {
  for (int64_t r = 0; r < q_len; ++r) {
    std::fill(st->acc + r * st->ld_acc, st->acc + r * st->ld_acc + d, 0.0f);
    st->m[r] = kNegInf;
    st->l[r] = 0.0f;
  }
}

absl::Status FlashForwardBlock(const FlashBlock& b, FlashRunning* st) {
  Tiles& w = ThreadTiles();
  float* S = w.s.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(b.d));
  const bool drop = b.dropout.p > 0.0f;
  const uint32_t threshold = DropoutThreshold(b.dropout.p);
  const float keep_scale = KeepScale(b.dropout.p);
  for (int64_t qa = 0; qa < b.q_len; qa += kTileQ) {
    const int64_t tq = std::min(kTileQ, b.q_len - qa);
    const int64_t q_last = b.q_start + qa + tq - 1;
    const int64_t doc_first = FirstDocStart(b, qa, tq);
    for (int64_t ka = 0; ka < b.k_len; ka += kTileK) {
      const int64_t tk = std::min(kTileK, b.k_len - ka);
      const int64_t k_first = b.k_start + ka;
      if (b.causal && k_first > q_last) break;  // this and later key tiles are masked
      if (k_first + tk <= doc_first) continue;  // before every query's document
      // S = scale Q_tile K_tileᵀ   [tq, tk]
      LOOM_RETURN_IF_ERROR(Sgemm(false, true, tq, tk, b.d, scale, b.q + qa * b.ld_q, b.ld_q,
                                 b.k + ka * b.ld_kv, b.ld_kv, 0.0f, S, kTileK));
      for (int64_t r = 0; r < tq; ++r) {
        const int64_t gi = b.q_start + qa + r;
        const Columns c = VisibleColumns(b, qa + r, k_first, tk);
        const int64_t n = c.hi - c.lo;
        float* const full_row = S + r * kTileK;
        std::fill(full_row, full_row + c.lo, 0.0f);
        std::fill(full_row + c.hi, full_row + tk, 0.0f);
        if (n == 0) continue;  // nothing visible: the state stays
        float* const row = full_row + c.lo;
        float& m = st->m[qa + r];
        float& l = st->l[qa + r];
        const float m_new = std::max(m, internal::MaxOf(row, n));
        const float alpha = m == kNegInf ? 0.0f : std::exp(m - m_new);
        float sum;
        ExpShiftRow(row, n, m_new, &sum);
        l = l * alpha + sum;
        m = m_new;
        if (drop) {
          uint32_t* bits = w.bits.data();
          internal::DropoutBitsRange(b.dropout.seed, b.dropout.offset,
                                     RowIndex(b, gi) + static_cast<uint64_t>(k_first + c.lo), n,
                                     bits);
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) row[j] = bits[j] >= threshold ? row[j] * keep_scale : 0.0f;
        }
        if (alpha != 1.0f) {
          float* acc = st->acc + (qa + r) * st->ld_acc;
#pragma omp simd
          for (int64_t e = 0; e < b.d; ++e) acc[e] *= alpha;
        }
      }
      // acc += P_dropped V_tile
      LOOM_RETURN_IF_ERROR(Sgemm(false, false, tq, b.d, tk, 1.0f, S, kTileK, b.v + ka * b.ld_kv,
                                 b.ld_kv, 1.0f, st->acc + qa * st->ld_acc, st->ld_acc));
    }
  }
  return absl::OkStatus();
}

void FlashRunningFinish(int64_t q_len, int64_t d, const FlashRunning& st, float* out,
                        int64_t ld_out, float* lse) {
  for (int64_t r = 0; r < q_len; ++r) {
    const float* acc = st.acc + r * st.ld_acc;
    float* o = out + r * ld_out;
    const float l = st.l[r];
    if (l == 0.0f) {
      std::fill(o, o + d, 0.0f);
      lse[r] = kNegInf;
      continue;
    }
    const float inv = 1.0f / l;
#pragma omp simd
    for (int64_t e = 0; e < d; ++e) o[e] = acc[e] * inv;
    lse[r] = st.m[r] + std::log(l);
  }
}

void FlashMergePartial(int64_t q_len, int64_t d, const float* o_b, int64_t ld_b,
                       const float* lse_b, float* o, int64_t ld_o, float* lse) {
  for (int64_t r = 0; r < q_len; ++r) {
    const float la = lse[r], lb = lse_b[r];
    float* dst = o + r * ld_o;
    const float* src = o_b + r * ld_b;
    if (lb == kNegInf) continue;
    if (la == kNegInf) {
      std::copy(src, src + d, dst);
      lse[r] = lb;
      continue;
    }
    const float mx = std::max(la, lb);
    const float lnew = mx + std::log(std::exp(la - mx) + std::exp(lb - mx));
    const float wa = std::exp(la - lnew), wb = std::exp(lb - lnew);
#pragma omp simd
    for (int64_t e = 0; e < d; ++e) dst[e] = dst[e] * wa + src[e] * wb;
    lse[r] = lnew;
  }
}

void FlashDelta(int64_t q_len, int64_t d, const float* dout, int64_t ld_dout, const float* out,
                int64_t ld_out, float* delta) {
  for (int64_t r = 0; r < q_len; ++r) {
    const float* a = dout + r * ld_dout;
    const float* o = out + r * ld_out;
    delta[r] = internal::SumOf(d, [&](int64_t e) { return a[e] * o[e]; });
  }
}

absl::Status FlashBackwardBlock(const FlashBlock& b, const float* dout, int64_t ld_dout,
                                const float* lse, const float* delta, const FlashGrads& g) {
  Tiles& w = ThreadTiles();
  float* S = w.s.data();
  float* DP = w.dp.data();
  const bool drop = b.dropout.p > 0.0f;
  float* PD = drop ? w.pd.data() : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(b.d));
  const uint32_t threshold = DropoutThreshold(b.dropout.p);
  const float keep_scale = KeepScale(b.dropout.p);
  for (int64_t ka = 0; ka < b.k_len; ka += kTileK) {
    const int64_t tk = std::min(kTileK, b.k_len - ka);
    const int64_t k_first = b.k_start + ka;
    const float* k_tile = b.k + ka * b.ld_kv;
    const float* v_tile = b.v + ka * b.ld_kv;
    for (int64_t qa = 0; qa < b.q_len; qa += kTileQ) {
      const int64_t tq = std::min(kTileQ, b.q_len - qa);
      if (b.causal && b.q_start + qa + tq - 1 < k_first) continue;  // the tile sees no key
      if (k_first + tk <= FirstDocStart(b, qa, tq)) continue;        // nor in its documents
      const float* q_tile = b.q + qa * b.ld_q;
      const float* dout_tile = dout + qa * ld_dout;
      // S = scale Q Kᵀ, dP = dO Vᵀ   [tq, tk]
      LOOM_RETURN_IF_ERROR(Sgemm(false, true, tq, tk, b.d, scale, q_tile, b.ld_q, k_tile,
                                 b.ld_kv, 0.0f, S, kTileK));
      LOOM_RETURN_IF_ERROR(Sgemm(false, true, tq, tk, b.d, 1.0f, dout_tile, ld_dout, v_tile,
                                 b.ld_kv, 0.0f, DP, kTileK));
      for (int64_t r = 0; r < tq; ++r) {
        const int64_t gi = b.q_start + qa + r;
        const float row_lse = lse[qa + r];
        Columns c = VisibleColumns(b, qa + r, k_first, tk);
        if (row_lse == kNegInf) c.hi = c.lo;
        const int64_t n = c.hi - c.lo;
        float* s_row = S + r * kTileK;
        float* dp_row = DP + r * kTileK;
        float* pd_row = drop ? PD + r * kTileK : nullptr;
        if (drop && n > 0) {
          internal::DropoutBitsRange(b.dropout.seed, b.dropout.offset,
                                     RowIndex(b, gi) + static_cast<uint64_t>(k_first + c.lo), n,
                                     w.bits.data());
        }
        BackwardRow(s_row + c.lo, dp_row + c.lo, drop ? pd_row + c.lo : nullptr, w.bits.data(),
                    threshold, keep_scale, n, row_lse, delta[qa + r]);
        for (float* x : {s_row, dp_row, pd_row}) {
          if (x == nullptr) continue;
          std::fill(x, x + c.lo, 0.0f);
          std::fill(x + c.hi, x + tk, 0.0f);
        }
      }
      // dV += P_droppedᵀ dO;  dQ += scale dS K;  dK += scale dSᵀ Q
      LOOM_RETURN_IF_ERROR(Sgemm(true, false, tk, b.d, tq, 1.0f, drop ? PD : S, kTileK, dout_tile,
                                 ld_dout, 1.0f, g.dv + ka * g.ld_dkv, g.ld_dkv));
      LOOM_RETURN_IF_ERROR(Sgemm(false, false, tq, b.d, tk, scale, DP, kTileK, k_tile, b.ld_kv,
                                 1.0f, g.dq + qa * g.ld_dq, g.ld_dq));
      LOOM_RETURN_IF_ERROR(Sgemm(true, false, tk, b.d, tq, scale, DP, kTileK, q_tile, b.ld_q,
                                 1.0f, g.dk + ka * g.ld_dkv, g.ld_dkv));
    }
  }
  return absl::OkStatus();
}

// --------------------------------------------------------------- kernels ----

namespace {

// The block of (batch bi, local head h) covering queries [q0, q0 + tq) and
// keys [0, k_len), pointers into qkv [s, b, heads, {q, k, v}, d].
FlashBlock PairBlock(const float* qkv, const AttentionDims& g, const AttentionDropout& dropout,
                     int64_t pair, int64_t q0, int64_t tq, int64_t k_len) {
  const int64_t bi = pair / g.heads, h = pair % g.heads;
  const int64_t ld_qkv = g.b * g.heads * 3 * g.d;
  const int64_t total = dropout.total_heads == 0 ? g.heads : dropout.total_heads;
  const float* q = qkv + (bi * g.heads + h) * 3 * g.d;
  FlashBlock blk;
  blk.d = g.d;
  blk.q = q + q0 * ld_qkv;
  blk.ld_q = ld_qkv;
  blk.q_start = q0;
  blk.q_len = tq;
  blk.k = q + g.d;
  blk.v = q + 2 * g.d;
  blk.ld_kv = ld_qkv;
  blk.k_start = 0;
  blk.k_len = k_len;
  blk.seq_len = g.s;
  blk.global_pair = bi * total + dropout.head_offset + h;
  blk.dropout = dropout;
  blk.causal = true;
  if (dropout.doc_start != nullptr) blk.q_doc_start = dropout.doc_start + bi * g.s + q0;
  return blk;
}

}  // namespace

absl::Status FlashAttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* lse,
                                   const AttentionDropout& dropout) {
  LOOM_ASSIGN_OR_RETURN(const AttentionDims g, internal::CheckCpuAttentionForward(
                                                   "FlashAttentionForward", qkv, heads, out,
                                                   AttentionSaved::kLse, lse, dropout));
  const int64_t ld_out = g.b * g.heads * g.d;
  const float* pqkv = qkv.data<float>();
  float* pout = out->data<float>();
  float* plse = lse->data<float>();
  const int64_t nq = (g.s + kTileQ - 1) / kTileQ;
  // Work items (pair, query tile), the longest (last) tiles first.
  return ParallelItems(g.b * g.heads * nq, [&](int64_t t) -> absl::Status {
    thread_local std::vector<float> state;
    state.resize(kTileQ * (g.d + 2));
    const int64_t pair = t / nq, q0 = (nq - 1 - t % nq) * kTileQ;
    const int64_t tq = std::min(kTileQ, g.s - q0);
    const int64_t bi = pair / g.heads, h = pair % g.heads;
    FlashRunning st{state.data(), g.d, state.data() + kTileQ * g.d,
                    state.data() + kTileQ * (g.d + 1)};
    const FlashBlock blk = PairBlock(pqkv, g, dropout, pair, q0, tq, q0 + tq);
    FlashRunningInit(tq, g.d, &st);
    LOOM_RETURN_IF_ERROR(FlashForwardBlock(blk, &st));
    FlashRunningFinish(tq, g.d, st, pout + q0 * ld_out + (bi * g.heads + h) * g.d, ld_out,
                       plse + pair * g.s + q0);
    return absl::OkStatus();
  });
}

absl::Status FlashAttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t heads, Tensor* dqkv,
                                    const AttentionDropout& dropout) {
  LOOM_ASSIGN_OR_RETURN(
      const AttentionDims g,
      internal::CheckCpuAttentionBackward("FlashAttentionBackward", dout, qkv, &out,
                                          AttentionSaved::kLse, lse, heads, dqkv, dropout));
  const int64_t ld_qkv = g.b * g.heads * 3 * g.d, ld_out = g.b * g.heads * g.d;
  const float* pqkv = qkv.data<float>();
  const float* pdout = dout.data<float>();
  const float* pout = out.data<float>();
  const float* plse = lse.data<float>();
  float* pdqkv = dqkv->data<float>();
  // One item per (batch, head): its dQ, dK, dV accumulate over the tiles in order.
  return ParallelItems(g.b * g.heads, [&](int64_t pair) -> absl::Status {
    thread_local std::vector<float> delta;
    delta.resize(g.s);
    const int64_t bi = pair / g.heads, h = pair % g.heads;
    const int64_t off_qkv = (bi * g.heads + h) * 3 * g.d, off_out = (bi * g.heads + h) * g.d;
    float* dq = pdqkv + off_qkv;
    for (int64_t t = 0; t < g.s; ++t) std::fill(dq + t * ld_qkv, dq + t * ld_qkv + 3 * g.d, 0.0f);
    FlashDelta(g.s, g.d, pdout + off_out, ld_out, pout + off_out, ld_out, delta.data());
    const FlashBlock blk = PairBlock(pqkv, g, dropout, pair, 0, g.s, g.s);
    const FlashGrads grads{dq, ld_qkv, dq + g.d, dq + 2 * g.d, ld_qkv};
    return FlashBackwardBlock(blk, pdout + off_out, ld_out, plse + pair * g.s, delta.data(),
                              grads);
  });
}

}  // namespace loom::core::cpu
