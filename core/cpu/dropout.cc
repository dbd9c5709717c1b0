#include "core/cpu/dropout.h"

#include <immintrin.h>

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

// The same with AVX-512: one group of 16 blocks per iteration.
__attribute__((target("arch=x86-64-v4"))) void DropoutBitsV4(uint64_t seed, uint64_t offset,
                                                             uint64_t first_group, int64_t n,
                                                             uint32_t* bits) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i low16 = _mm512_set1_epi32(0xffff);
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t block = 16 * (first_group + k);
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(block)), iota);
    __m512i c1 = _mm512_set1_epi32(static_cast<int>(block >> 32));
    __m512i c2 = _mm512_set1_epi32(static_cast<int>(offset));
    __m512i c3 = _mm512_set1_epi32(static_cast<int>(offset >> 32));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m512i e0 = _mm512_mul_epu32(c0, m0);
      const __m512i o0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
      const __m512i e1 = _mm512_mul_epu32(c2, m1);
      const __m512i o1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
      const __m512i lo0 = _mm512_mask_blend_epi32(0xAAAA, e0, _mm512_slli_epi64(o0, 32));
      const __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e0, 32), o0);
      const __m512i lo1 = _mm512_mask_blend_epi32(0xAAAA, e1, _mm512_slli_epi64(o1, 32));
      const __m512i hi1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e1, 32), o1);
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint32_t* out = bits + kGroup * k;
    const __m512i words[4] = {c0, c1, c2, c3};
    for (int w = 0; w < 4; ++w) {
      _mm512_storeu_si512(out + 16 * w, _mm512_and_si512(words[w], low16));
      _mm512_storeu_si512(out + 64 + 16 * w, _mm512_srli_epi32(words[w], 16));
    }
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

absl::Status Validate(const char* op, const Tensor& x, const DropoutOptions& opts,
                      const GlobalIndex& where) {
  if (!(opts.p >= 0.0f && opts.p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": p = ", opts.p, " is outside [0, 1] (x ", x.DebugString(), ")"));
  }
  if (x.rank() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", x.DebugString(), " needs rank >= 1"));
  }
  const int64_t c = x.dim(x.rank() - 1);
  if (where.first_index < 0 || (where.row_stride != 0 && where.row_stride < c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": GlobalIndex{first_index = ", where.first_index, ", row_stride = ", where.row_stride,
        "} for x ", x.DebugString(), ": need first_index >= 0 and row_stride 0 or >= ", c));
  }
  return absl::OkStatus();
}

// out = in * keep * scale; mask (may be null) = keep.
void Apply(const float* in, float* out, uint8_t* mask, int64_t numel, int64_t c,
           const DropoutOptions& opts, const GlobalIndex& where) {
  if (c == 0) return;
  const int64_t rows = numel / c;
  const int64_t stride = where.row_stride == 0 ? c : where.row_stride;
  const uint32_t threshold = DropoutThreshold(opts.p);
  const float scale = opts.p >= 1.0f ? 0.0f : 1.0f / (1.0f - opts.p);
#pragma omp parallel
  {
    alignas(64) uint32_t bits[kGroup * kTileGroups];
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t g_row = where.first_index + r * stride;  // global index of (r, 0)
      for (int64_t c0 = 0; c0 < c;) {
        // Tile: the groups that hold global indices [g_row + c0, ...).
        const int64_t g = g_row + c0;
        const int64_t first_group = g / kGroup;
        const int64_t skip = g % kGroup;
        const int64_t len = std::min(c - c0, kGroup * kTileGroups - skip);
        const int64_t ngroups = (skip + len + kGroup - 1) / kGroup;
        DropoutBits(opts.seed, opts.offset, static_cast<uint64_t>(first_group), ngroups, bits);
        const uint32_t* b = bits + skip;
        const float* src = in + r * c + c0;
        float* dst = out + r * c + c0;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) dst[j] = b[j] >= threshold ? src[j] * scale : 0.0f;
        if (mask != nullptr) {
          uint8_t* m = mask + r * c + c0;
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) m[j] = b[j] >= threshold ? 1 : 0;
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
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckInput(kOp, "x", x));
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckOutput(kOp, "out", out));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "x", x, "out", *out));
  LOOM_CPU_RETURN_IF_ERROR(Validate(kOp, x, opts, where));
  uint8_t* pm = nullptr;
  if (mask != nullptr) {
    LOOM_CPU_RETURN_IF_ERROR(internal::CheckInput(kOp, "mask", *mask, DType::kU8));
    LOOM_CPU_RETURN_IF_ERROR(
        internal::CheckNumel(kOp, "mask", *mask, x.numel(), "one byte per element of x"));
    pm = mask->data<uint8_t>();
  }
  Apply(x.data<float>(), out->data<float>(), pm, x.numel(), x.dim(x.rank() - 1), opts, where);
  return absl::OkStatus();
}

absl::Status DropoutBackward(const Tensor& dout, Tensor* dx, const DropoutOptions& opts,
                             const GlobalIndex& where) {
  constexpr const char* kOp = "DropoutBackward";
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckInput(kOp, "dout", dout));
  LOOM_CPU_RETURN_IF_ERROR(internal::CheckOutput(kOp, "dx", dx));
  LOOM_CPU_RETURN_IF_ERROR(CheckSameShape(kOp, "dout", dout, "dx", *dx));
  LOOM_CPU_RETURN_IF_ERROR(Validate(kOp, dout, opts, where));
  Apply(dout.data<float>(), dx->data<float>(), nullptr, dout.numel(), dout.dim(dout.rank() - 1),
        opts, where);
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
