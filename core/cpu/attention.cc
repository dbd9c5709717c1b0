#include "core/cpu/attention.h"

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
#include "core/cpu/softmax.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

// Rows per causal block: block i multiplies only the first (i+1)*kBlock keys.
constexpr int64_t kBlock = 128;

// The regenerated mask of one (batch, local head) pair: Row(i) fills bits
// with the Philox bits of probabilities row i, columns [0, i].
struct MaskRows {
  const AttentionDropout& dr;
  uint64_t pair_base;  // global index of element (i = 0, j = 0) of this pair
  int64_t s;
  uint32_t threshold;
  float scale;
  MaskRows(const AttentionDropout& dr, const AttentionDims& g, int64_t pair)
      : dr(dr),
        s(g.s),
        threshold(DropoutThreshold(dr.p)),
        scale(dr.p >= 1.0f ? 0.0f : 1.0f / (1.0f - dr.p)) {
    const int64_t total = dr.total_heads == 0 ? g.heads : dr.total_heads;
    const int64_t bi = pair / g.heads, h = pair % g.heads;
    pair_base = static_cast<uint64_t>((bi * total + dr.head_offset + h) * g.s) *
                static_cast<uint64_t>(g.s);
  }
  void Row(int64_t i, uint32_t* bits) const {
    internal::DropoutBitsRange(dr.seed, dr.offset, pair_base + static_cast<uint64_t>(i * s), i + 1,
                               bits);
  }
};

// Runs fn(pair, scratch) for every (batch, head) pair: one pair per thread
// when there are enough pairs (the GEMMs then run single-threaded), else one
// after the other with multi-threaded GEMMs. Returns the first error.
template <typename Fn>
absl::Status ForEachPair(int64_t pairs, size_t scratch_floats, Fn fn) {
  const bool outer = pairs >= omp_get_max_threads();
  absl::Status first_error;
#pragma omp parallel if (outer)
  {
    std::vector<float> scratch(scratch_floats);
#pragma omp for schedule(dynamic)
    for (int64_t p = 0; p < pairs; ++p) {
      absl::Status s = fn(p, scratch.data());
      if (!s.ok()) {
#pragma omp critical
        if (first_error.ok()) first_error = s;
      }
    }
  }
  return first_error;
}

}  // namespace


absl::Status AttentionForward(const Tensor& qkv, int64_t heads, Tensor* out, Tensor* probs,
                              const AttentionDropout& dropout) {
  LOOM_ASSIGN_OR_RETURN(const AttentionDims g,
                        internal::CheckCpuAttentionForward("AttentionForward", qkv, heads, out,
                                                           AttentionSaved::kProbs, probs, dropout));
  const int64_t ld_qkv = g.b * g.heads * 3 * g.d, ld_out = g.b * g.heads * g.d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.d));
  const float* pqkv = qkv.data<float>();
  float* pout = out->data<float>();
  float* pprobs = probs->data<float>();
  const bool drop = dropout.p > 0.0f;
  // With dropout: the dropped rows of one causal block (P·V reads them).
  const size_t scratch = drop ? static_cast<size_t>(std::min(kBlock, g.s) * g.s) : 0;
  return ForEachPair(g.b * g.heads, scratch, [&](int64_t pair, float* pd) -> absl::Status {
    const int64_t bi = pair / g.heads, h = pair % g.heads;
    const float* q = pqkv + bi * g.heads * 3 * g.d + h * 3 * g.d;
    const float* k = q + g.d;
    const float* v = q + 2 * g.d;
    float* p = pprobs + pair * g.s * g.s;
    float* o = pout + bi * g.heads * g.d + h * g.d;
    std::vector<uint32_t> bits(drop ? g.s : 0);
    const MaskRows mask(dropout, g, pair);
    for (int64_t r0 = 0; r0 < g.s; r0 += kBlock) {
      const int64_t r1 = std::min(g.s, r0 + kBlock);
      // P[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]ᵀ
      LOOM_RETURN_IF_ERROR(Sgemm(false, true, r1 - r0, r1, g.d, scale, q + r0 * ld_qkv, ld_qkv,
                                 k, ld_qkv, 0.0f, p + r0 * g.s, g.s));
      for (int64_t i = r0; i < r1; ++i) {
        float* row = p + i * g.s;
        // Packed documents: keys before row i's document get probability 0.
        const int64_t lo = dropout.doc_start == nullptr ? 0 : dropout.doc_start[bi * g.s + i];
        internal::SoftmaxRow(row + lo, row + lo, i + 1 - lo, 1.0f);
        std::fill(row, row + lo, 0.0f);
        std::fill(row + i + 1, row + g.s, 0.0f);
        if (drop) {  // pd row = P row * keep / (1 - p); probs stays pre-dropout
          float* dst = pd + (i - r0) * g.s;
          const uint32_t* b = bits.data();
          const uint32_t t = mask.threshold;
          const float sc = mask.scale;
          mask.Row(i, bits.data());
#pragma omp simd
          for (int64_t j = 0; j <= i; ++j) dst[j] = b[j] >= t ? row[j] * sc : 0.0f;
          std::fill(dst + i + 1, dst + r1, 0.0f);
        }
      }
      // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]  (P after dropout)
      const float* pv = drop ? pd : p + r0 * g.s;
      LOOM_RETURN_IF_ERROR(Sgemm(false, false, r1 - r0, g.d, r1, 1.0f, pv, g.s, v, ld_qkv,
                                 0.0f, o + r0 * ld_out, ld_out));
    }
    return absl::OkStatus();
  });
}

absl::Status AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                               int64_t heads, Tensor* dqkv, const AttentionDropout& dropout) {
  LOOM_ASSIGN_OR_RETURN(
      const AttentionDims g,
      internal::CheckCpuAttentionBackward("AttentionBackward", dout, qkv, /*out=*/nullptr,
                                          AttentionSaved::kProbs, probs, heads, dqkv, dropout));
  const int64_t ld_qkv = g.b * g.heads * 3 * g.d, ld_out = g.b * g.heads * g.d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.d));
  const float* pqkv = qkv.data<float>();
  const float* pdout = dout.data<float>();
  const float* pprobs = probs.data<float>();
  float* pdqkv = dqkv->data<float>();
  const int64_t s = g.s;
  const bool drop = dropout.p > 0.0f;
  // Scratch: dS [s, s]; with dropout also the dropped P [s, s] (for dV).
  return ForEachPair(g.b * g.heads, (drop ? 2 : 1) * s * s, [&](int64_t pair, float* ds) -> absl::Status {
    const int64_t bi = pair / g.heads, h = pair % g.heads;
    const int64_t off_qkv = bi * g.heads * 3 * g.d + h * 3 * g.d;
    const float* q = pqkv + off_qkv;
    const float* k = q + g.d;
    const float* v = q + 2 * g.d;
    float* dq = pdqkv + off_qkv;
    float* dk = dq + g.d;
    float* dv = dq + 2 * g.d;
    const float* p = pprobs + pair * s * s;
    const float* dout_p = pdout + bi * g.heads * g.d + h * g.d;
    float* pd = drop ? ds + s * s : nullptr;
    std::vector<uint32_t> bits(drop ? s : 0);
    const MaskRows mask(dropout, g, pair);
    for (int64_t r0 = 0; r0 < s; r0 += kBlock) {
      const int64_t r1 = std::min(s, r0 + kBlock);
      // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]ᵀ, kept in ds.
      LOOM_RETURN_IF_ERROR(Sgemm(false, true, r1 - r0, r1, g.d, 1.0f, dout_p + r0 * ld_out,
                                 ld_out, v, ld_qkv, 0.0f, ds + r0 * s, s));
      // dS = scale * P * (dP - rowsum(P * dP)); zero above the diagonal.
      // With dropout, dP above is the gradient of the dropped P: dP *= keep / (1 - p).
      for (int64_t i = r0; i < r1; ++i) {
        const float* pr = p + i * s;
        float* dr = ds + i * s;
        if (drop) {
          float* pdr = pd + i * s;
          const uint32_t* b = bits.data();
          const uint32_t t = mask.threshold;
          const float sc = mask.scale;
          mask.Row(i, bits.data());
#pragma omp simd
          for (int64_t j = 0; j <= i; ++j) {
            const bool keep = b[j] >= t;
            dr[j] = keep ? dr[j] * sc : 0.0f;
            pdr[j] = keep ? pr[j] * sc : 0.0f;
          }
          std::fill(pdr + i + 1, pdr + s, 0.0f);
        }
        const float dot = internal::SumOf(i + 1, [&](int64_t j) { return pr[j] * dr[j]; });
#pragma omp simd
        for (int64_t j = 0; j <= i; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
        std::fill(dr + i + 1, dr + s, 0.0f);
      }
      // dQ[r0:r1] = dS[r0:r1, 0:r1] K[0:r1]
      LOOM_RETURN_IF_ERROR(Sgemm(false, false, r1 - r0, g.d, r1, 1.0f, ds + r0 * s, s, k,
                                 ld_qkv, 0.0f, dq + r0 * ld_qkv, ld_qkv));
    }
    for (int64_t c0 = 0; c0 < s; c0 += kBlock) {
      const int64_t c1 = std::min(s, c0 + kBlock);
      // dK[c0:c1] = dS[c0:s, c0:c1]ᵀ Q[c0:s];  dV[c0:c1] = P[c0:s, c0:c1]ᵀ dO[c0:s]
      LOOM_RETURN_IF_ERROR(Sgemm(true, false, c1 - c0, g.d, s - c0, 1.0f, ds + c0 * s + c0, s,
                                 q + c0 * ld_qkv, ld_qkv, 0.0f, dk + c0 * ld_qkv, ld_qkv));
      const float* pv = drop ? pd : p;  // P after dropout
      LOOM_RETURN_IF_ERROR(Sgemm(true, false, c1 - c0, g.d, s - c0, 1.0f, pv + c0 * s + c0, s,
                                 dout_p + c0 * ld_out, ld_out, 0.0f, dv + c0 * ld_qkv, ld_qkv));
    }
    return absl::OkStatus();
  });
}

}  // namespace loom::core::cpu
