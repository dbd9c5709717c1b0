#include "core/cpu/dropout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/cpu/philox.h"
#include "core/cpu/vec_math.h"

namespace loom::core::cpu {
namespace {

// Groups of 128 elements (16 Philox blocks) generated per tile.
constexpr int64_t kTileGroups = 16;

constexpr int64_t kGroup = 128;

// AVX2: 32x32 -> 64-bit products of 8 lanes, split into high and low words.
inline void MulHiLo8(__m256i a, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// bits[128 k + r] = DropoutBitsAt(seed, offset, 128 (first_group + k) + r), k < n.
void DropoutBitsV3(uint64_t seed, uint64_t offset, uint64_t first_group, int64_t n,
                   uint32_t* bits) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  for (int64_t k = 0; k < n; ++k) {
    for (int half = 0; half < 2; ++half) {
      // Blocks 16 g + 8 half + lane never straddle a 2^32 boundary (16 | 2^32).
      const uint64_t block = 16 * (first_group + k) + 8 * half;
      __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(block)), iota);
      __m256i c1 = _mm256_set1_epi32(static_cast<int>(block >> 32));
      __m256i c2 = _mm256_set1_epi32(static_cast<int>(offset));
      __m256i c3 = _mm256_set1_epi32(static_cast<int>(offset >> 32));
      uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
      for (int round = 0; round < 10; ++round) {
        __m256i hi0, lo0, hi1, lo1;
        MulHiLo8(c0, m0, &hi0, &lo0);
        MulHiLo8(c2, m1, &hi1, &lo1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
        c1 = lo1;
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      uint32_t* out = bits + kGroup * k + 8 * half;
      const __m256i words[4] = {c0, c1, c2, c3};
      for (int w = 0; w < 4; ++w) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * w),
                            _mm256_and_si256(words[w], low16));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 + 16 * w),
                            _mm256_srli_epi32(words[w], 16));
      }
    }
  }
}

// The same with AVX-512. Each 64-bit lane holds one block's 32-bit word in
// its low half (the high half is don't-care): vpmuludq then gives the full
// 64-bit Philox product, whose high word is one shift away, and the
// three-way xor is one vpternlogd. A group is two registers per word (blocks
// 0-7 and 8-15); two groups (four independent chains) are interleaved to
// hide the multiply latency. Exact integer arithmetic: bit-identical to
// DropoutBitsV3 and Philox4x32_10.
struct PhiloxLanes {
  __m512i c0, c1, c2, c3;
};

__attribute__((target("arch=x86-64-v4"), always_inline)) inline void PhiloxRound(
    PhiloxLanes* s, __m512i m0, __m512i m1, __m512i k0, __m512i k1) {
  const __m512i p0 = _mm512_mul_epu32(s->c0, m0);
  const __m512i p1 = _mm512_mul_epu32(s->c2, m1);
  s->c0 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p1, 32), s->c1, k0, 0x96);
  s->c1 = p1;
  s->c2 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0, 32), s->c3, k1, 0x96);
  s->c3 = p0;
}

// Philox4x32-10's multipliers (one per 64-bit lane) and Weyl increments, and
// the key {lo(seed), hi(seed)}, broadcast.
struct PhiloxParamsV4 {
  __m512i m0, m1, w0, w1, key0, key1;
};

__attribute__((target("arch=x86-64-v4"), always_inline)) inline PhiloxParamsV4 PhiloxParams(
    uint64_t seed) {
  return {_mm512_set1_epi64(0xD2511F53u),
          _mm512_set1_epi64(0xCD9E8D57u),
          _mm512_set1_epi32(static_cast<int>(0x9E3779B9u)),
          _mm512_set1_epi32(static_cast<int>(0xBB67AE85u)),
          _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed))),
          _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed >> 32)))};
}

// The ten Philox rounds over any number of independent lane groups, the
// rounds of the groups interleaved (their multiplies overlap).
template <typename... Lanes>
__attribute__((target("arch=x86-64-v4"), always_inline)) inline void PhiloxTenRounds(
    const PhiloxParamsV4& p, Lanes*... s) {
  __m512i k0 = p.key0, k1 = p.key1;
  for (int round = 0; round < 10; ++round) {
    (PhiloxRound(s, p.m0, p.m1, k0, k1), ...);
    k0 = _mm512_add_epi32(k0, p.w0);
    k1 = _mm512_add_epi32(k1, p.w1);
  }
}

__attribute__((target("arch=x86-64-v4"), always_inline)) inline PhiloxLanes PhiloxInit(
    uint64_t block, uint64_t offset) {
  const __m512i iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  return {_mm512_add_epi64(_mm512_set1_epi64(static_cast<uint32_t>(block)), iota),
          _mm512_set1_epi32(static_cast<int>(block >> 32)),
          _mm512_set1_epi32(static_cast<int>(offset)),
          _mm512_set1_epi32(static_cast<int>(offset >> 32))};
}

// Word w of a group's 16 blocks from its two halves (blocks 0-7 in a's even
// 32-bit lanes, 8-15 in b's): lane l of words[w] is block l's word w.
__attribute__((target("arch=x86-64-v4"), always_inline)) inline void GroupWordsV4(
    const PhiloxLanes& a, const PhiloxLanes& b, __m512i words[4]) {
  const __m512i idx =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  words[0] = _mm512_permutex2var_epi32(a.c0, idx, b.c0);
  words[1] = _mm512_permutex2var_epi32(a.c1, idx, b.c1);
  words[2] = _mm512_permutex2var_epi32(a.c2, idx, b.c2);
  words[3] = _mm512_permutex2var_epi32(a.c3, idx, b.c3);
}

// The 16-bit draws of the group's elements 16 q .. 16 q + 15 (q < 8), one per
// 32-bit lane: the low halves of words[q] for q < 4, then the high halves.
__attribute__((target("arch=x86-64-v4"), always_inline)) inline __m512i GroupBitsV4(
    const __m512i words[4], int q) {
  return q < 4 ? _mm512_and_si512(words[q], _mm512_set1_epi32(0xffff))
               : _mm512_srli_epi32(words[q - 4], 16);
}

// Writes the 128 values of one group from its two halves (blocks 0-7, 8-15).
__attribute__((target("arch=x86-64-v4"), always_inline)) inline void PhiloxStoreGroup(
    const PhiloxLanes& a, const PhiloxLanes& b, uint32_t* out) {
  __m512i words[4];
  GroupWordsV4(a, b, words);
  for (int w = 0; w < 4; ++w) {
    _mm512_store_si512(out + 16 * w, GroupBitsV4(words, w));
    _mm512_store_si512(out + 64 + 16 * w, GroupBitsV4(words, 4 + w));
  }
}

// `bits` must be 64-byte aligned.
__attribute__((target("arch=x86-64-v4"))) void DropoutBitsV4(uint64_t seed, uint64_t offset,
                                                             uint64_t first_group, int64_t n,
                                                             uint32_t* bits) {
  const PhiloxParamsV4 philox = PhiloxParams(seed);
  int64_t k = 0;
  for (; k + 2 <= n; k += 2) {
    const uint64_t block = 16 * (first_group + k);
    PhiloxLanes s0 = PhiloxInit(block, offset), s1 = PhiloxInit(block + 8, offset);
    PhiloxLanes s2 = PhiloxInit(block + 16, offset), s3 = PhiloxInit(block + 24, offset);
    PhiloxTenRounds(philox, &s0, &s1, &s2, &s3);
    PhiloxStoreGroup(s0, s1, bits + kGroup * k);
    PhiloxStoreGroup(s2, s3, bits + kGroup * (k + 1));
  }
  if (k < n) {
    const uint64_t block = 16 * (first_group + k);
    PhiloxLanes s0 = PhiloxInit(block, offset), s1 = PhiloxInit(block + 8, offset);
    PhiloxTenRounds(philox, &s0, &s1);
    PhiloxStoreGroup(s0, s1, bits + kGroup * k);
  }
}

// Fused AVX-512 dropout of one row segment: the Philox words of each group
// stay in registers (no bits tile round trip through L1) and are compared and
// applied directly. Elements [0, len) of src/dst/mask have global indices
// [g0, g0 + len). Exact integer arithmetic: masks bit-identical to
// DropoutBitsAt.
//
// A group that [0, len) cuts (the head or tail of the segment): lanes outside
// [0, len) are masked off (masked loads/stores suppress faults).
__attribute__((target("arch=x86-64-v4"), always_inline)) inline void ApplyGroupV4(
    const PhiloxLanes& a, const PhiloxLanes& b, int64_t e0, int64_t len, const float* src,
    float* dst, uint8_t* mask, __m512i thr, __m512 vs) {
  const __m128i one = _mm_set1_epi8(1);
  __m512i words[4];
  GroupWordsV4(a, b, words);
  for (int q = 0; q < 8; ++q) {
    const int64_t e = e0 + 16 * q;
    if (e + 16 <= 0 || e >= len) continue;
    const int64_t lo = e < 0 ? -e : 0, hi = len - e < 16 ? len - e : 16;
    const __mmask16 t = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    const __mmask16 keep = _mm512_mask_cmpge_epu32_mask(t, GroupBitsV4(words, q), thr);
    _mm512_mask_storeu_ps(dst + e, t, _mm512_maskz_mul_ps(keep, _mm512_maskz_loadu_ps(t, src + e), vs));
    if (mask != nullptr) _mm_mask_storeu_epi8(mask + e, t, _mm_maskz_mov_epi8(keep, one));
  }
}

// A whole group whose 8 source vectors are already loaded: plain (unmasked)
// stores; masked stores to lines that are not in cache are much slower than
// plain ones on some cores.
__attribute__((target("arch=x86-64-v4"), always_inline)) inline void ApplyWholeGroupV4(
    const PhiloxLanes& a, const PhiloxLanes& b, const __m512* x, int64_t e0, float* dst,
    uint8_t* mask, __m512i thr, __m512 vs) {
  const __m128i one = _mm_set1_epi8(1);
  __m512i words[4];
  GroupWordsV4(a, b, words);
  for (int q = 0; q < 8; ++q) {
    const int64_t e = e0 + 16 * q;
    const __mmask16 keep = _mm512_cmpge_epu32_mask(GroupBitsV4(words, q), thr);
    _mm512_storeu_ps(dst + e, _mm512_maskz_mul_ps(keep, x[q], vs));
    if (mask != nullptr) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(mask + e), _mm_maskz_mov_epi8(keep, one));
    }
  }
}

__attribute__((target("arch=x86-64-v4"))) void DropoutRowV4(uint64_t seed, uint64_t offset,
                                                            int64_t g0, int64_t len,
                                                            const float* src, float* dst,
                                                            uint8_t* mask, uint32_t threshold,
                                                            float scale) {
  if (len <= 0) return;
  const PhiloxParamsV4 philox = PhiloxParams(seed);
  const __m512i thr = _mm512_set1_epi32(static_cast<int>(threshold));
  const __m512 vs = _mm512_set1_ps(scale);
  const int64_t gend = (g0 + len + kGroup - 1) / kGroup;
  int64_t g = g0 / kGroup;
  // Pairs of whole groups: 4 Philox chains for latency hiding; the first
  // group's 8 loads are issued before the rounds, so they reach memory early
  // (the rounds otherwise fill the out-of-order window and, once the data no
  // longer fits in cache, the loads serialise behind them).
  for (; g + 1 < gend; g += 2) {
    const int64_t e0 = g * kGroup - g0;
    if (!(e0 >= 0 && e0 + 2 * kGroup <= len)) break;
    const uint64_t block = 16 * static_cast<uint64_t>(g);
    __m512 x[8];
    for (int q = 0; q < 8; ++q) x[q] = _mm512_loadu_ps(src + e0 + 16 * q);
    PhiloxLanes s0 = PhiloxInit(block, offset), s1 = PhiloxInit(block + 8, offset);
    PhiloxLanes s2 = PhiloxInit(block + 16, offset), s3 = PhiloxInit(block + 24, offset);
    PhiloxTenRounds(philox, &s0, &s1, &s2, &s3);
    // All loads of the pair precede its stores.
    __m512 y[8];
    for (int q = 0; q < 8; ++q) y[q] = _mm512_loadu_ps(src + e0 + kGroup + 16 * q);
    ApplyWholeGroupV4(s0, s1, x, e0, dst, mask, thr, vs);
    ApplyWholeGroupV4(s2, s3, y, e0 + kGroup, dst, mask, thr, vs);
  }
  for (; g < gend; ++g) {
    const uint64_t block = 16 * static_cast<uint64_t>(g);
    const int64_t e0 = g * kGroup - g0;
    const bool full = e0 >= 0 && e0 + kGroup <= len;
    __m512 x[8];
    if (full) {
      for (int q = 0; q < 8; ++q) x[q] = _mm512_loadu_ps(src + e0 + 16 * q);
    }
    PhiloxLanes s0 = PhiloxInit(block, offset), s1 = PhiloxInit(block + 8, offset);
    PhiloxTenRounds(philox, &s0, &s1);
    if (full) {
      ApplyWholeGroupV4(s0, s1, x, e0, dst, mask, thr, vs);
    } else {
      ApplyGroupV4(s0, s1, e0, len, src, dst, mask, thr, vs);
    }
  }
}

// dst = b >= threshold ? src * scale : 0; mask (may be null) = b >= threshold.
__attribute__((target("arch=x86-64-v4"))) void ApplyTileV4(const uint32_t* b, const float* src,
                                                           float* dst, uint8_t* mask, int64_t len,
                                                           uint32_t threshold, float scale) {
  const __m512i thr = _mm512_set1_epi32(static_cast<int>(threshold));
  const __m512 vs = _mm512_set1_ps(scale);
  const __m128i one = _mm_set1_epi8(1);
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 t = static_cast<__mmask16>(len - j >= 16 ? 0xffffu : (1u << (len - j)) - 1u);
    const __mmask16 keep = _mm512_mask_cmpge_epu32_mask(t, _mm512_maskz_loadu_epi32(t, b + j), thr);
    _mm512_mask_storeu_ps(dst + j, t, _mm512_maskz_mul_ps(keep, _mm512_maskz_loadu_ps(t, src + j), vs));
    if (mask != nullptr) _mm_mask_storeu_epi8(mask + j, t, _mm_maskz_mov_epi8(keep, one));
  }
}

void ApplyTileV3(const uint32_t* b, const float* src, float* dst, uint8_t* mask, int64_t len,
                 uint32_t threshold, float scale) {
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) dst[j] = b[j] >= threshold ? src[j] * scale : 0.0f;
  if (mask != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) mask[j] = b[j] >= threshold ? 1 : 0;
  }
}

void DropoutBits(uint64_t seed, uint64_t offset, uint64_t first_group, int64_t n, uint32_t* bits) {
  if (internal::UseAvx512()) {
    DropoutBitsV4(seed, offset, first_group, n, bits);
  } else {
    DropoutBitsV3(seed, offset, first_group, n, bits);
  }
}

}  // namespace

namespace internal {
void DropoutBitsRange(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, uint32_t* bits) {
  alignas(64) uint32_t tile[kGroup * kTileGroups];
  for (int64_t done = 0; done < n;) {
    const uint64_t g = first + static_cast<uint64_t>(done);
    const int64_t skip = static_cast<int64_t>(g % kGroup);
    const int64_t len = std::min(n - done, kGroup * kTileGroups - skip);
    const int64_t ngroups = (skip + len + kGroup - 1) / kGroup;
    DropoutBits(seed, offset, g / kGroup, ngroups, tile);
    std::copy(tile + skip, tile + skip + len, bits + done);
    done += len;
  }
}
}  // namespace internal

namespace {

// out = in * keep * scale; mask (may be null) = keep.
void Apply(const float* in, float* out, uint8_t* mask, int64_t numel, int64_t c,
           const DropoutOptions& opts, const GlobalIndex& where) {
  if (c == 0) return;
  const int64_t rows = numel / c;
  const int64_t stride = where.row_stride == 0 ? c : where.row_stride;
  const uint32_t threshold = DropoutThreshold(opts.p);
  const float scale = opts.p >= 1.0f ? 0.0f : 1.0f / (1.0f - opts.p);
  const bool avx512 = internal::UseAvx512();
#pragma omp parallel
  {
    alignas(64) uint32_t bits[kGroup * kTileGroups];
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t g_row = where.first_index + r * stride;  // global index of (r, 0)
      if (avx512) {
        DropoutRowV4(opts.seed, opts.offset, g_row, c, in + r * c, out + r * c,
                     mask != nullptr ? mask + r * c : nullptr, threshold, scale);
        continue;
      }
      for (int64_t c0 = 0; c0 < c;) {
        // Tile: the groups that hold global indices [g_row + c0, ...).
        const int64_t g = g_row + c0;
        const int64_t first_group = g / kGroup;
        const int64_t skip = g % kGroup;
        const int64_t len = std::min(c - c0, kGroup * kTileGroups - skip);
        const int64_t ngroups = (skip + len + kGroup - 1) / kGroup;
        DropoutBits(opts.seed, opts.offset, static_cast<uint64_t>(first_group), ngroups, bits);
        uint8_t* m = mask != nullptr ? mask + r * c + c0 : nullptr;
        if (avx512) {
          ApplyTileV4(bits + skip, in + r * c + c0, out + r * c + c0, m, len, threshold, scale);
        } else {
          ApplyTileV3(bits + skip, in + r * c + c0, out + r * c + c0, m, len, threshold, scale);
        }
        c0 += len;
      }
    }
  }
}

}  // namespace


absl::Status DropoutForward(const Tensor& x, Tensor* out, const DropoutOptions& opts,
                            const GlobalIndex& where, Tensor* mask) {
  constexpr const char* kOp = "DropoutForward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "out", out));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  LOOM_RETURN_IF_ERROR(ops::CheckDropoutArgs(kOp, x, opts, where));
  uint8_t* pm = nullptr;
  if (mask != nullptr) {
    LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "mask", *mask, DType::kU8));
    LOOM_RETURN_IF_ERROR(
        internal::CheckNumel(kOp, "mask", *mask, x.numel(), "one byte per element of x"));
    pm = mask->data<uint8_t>();
  }
  Apply(x.data<float>(), out->data<float>(), pm, x.numel(), x.dim(x.rank() - 1), opts, where);
  return absl::OkStatus();
}

absl::Status DropoutBackward(const Tensor& dout, Tensor* dx, const DropoutOptions& opts,
                             const GlobalIndex& where) {
  constexpr const char* kOp = "DropoutBackward";
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "dout", dout));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "dx", dx));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "dout", dout, "dx", *dx));
  LOOM_RETURN_IF_ERROR(ops::CheckDropoutArgs(kOp, dout, opts, where));
  Apply(dout.data<float>(), dx->data<float>(), nullptr, dout.numel(), dout.dim(dout.rank() - 1),
        opts, where);
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
