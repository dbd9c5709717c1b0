#include "core/cpu/convert.h"

#include <immintrin.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"

namespace loom::core::cpu {
namespace {

constexpr int64_t kChunk = 1 << 14;  // elements per parallel task

// Round to nearest even on 8 lanes of f32 bits; NaN -> quiet NaN. Results
// are in the low 16 bits of each lane.
inline __m256i Bf16Lanes(__m256i u) {
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

// dst[i] = src[i] converted, in parallel chunks of kChunk elements: vec(s, d)
// converts the kWidth elements from s to d, one(x) a single element (each
// chunk's tail). Both are captureless, so the loops keep src and dst in
// registers.
template <int64_t kWidth, typename Src, typename Dst, typename Vec, typename One>
void ConvertChunks(const Src* src, Dst* dst, int64_t n, Vec vec, One one) {
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = c0 + kChunk < n ? c0 + kChunk : n;
    int64_t i = c0;
    for (; i + kWidth <= c1; i += kWidth) vec(src + i, dst + i);
    for (; i < c1; ++i) dst[i] = one(src[i]);
  }
}

void Bf16ToF32(const uint16_t* src, float* dst, int64_t n) {
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(src[i]) << 16;
}

void F32ToF16(const float* src, uint16_t* dst, int64_t n) {
  ConvertChunks<8>(
      src, dst, n,
      [](const float* s, uint16_t* d) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d), h);
      },
      [](float f) { return FloatToF16Bits(f); });
}

void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  ConvertChunks<8>(
      src, dst, n,
      [](const uint16_t* s, float* d) {
        _mm256_storeu_ps(d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))));
      },
      [](uint16_t h) { return F16BitsToFloat(h); });
}

}  // namespace

void F32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  ConvertChunks<16>(
      src, dst, n,
      [](const float* s, uint16_t* d) {
        const __m256i a = Bf16Lanes(_mm256_castps_si256(_mm256_loadu_ps(s)));
        const __m256i b = Bf16Lanes(_mm256_castps_si256(_mm256_loadu_ps(s + 8)));
        // packus interleaves 128-bit lanes (a0-3 b0-3 a4-7 b4-7): restore order.
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), packed);
      },
      [](float f) { return FloatToBf16Bits(f); });
}

uint16_t FloatToF16Bits(float f) {
  const __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT);
  return static_cast<uint16_t>(_mm_extract_epi16(h, 0));
}

float F16BitsToFloat(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

absl::Status Convert(const Tensor& src, Tensor* dst) {
  constexpr const char* kOp = "Convert";
  if (!src.defined()) return absl::InvalidArgumentError("Convert: src is undefined");
  LOOM_RETURN_IF_ERROR(CheckCpu(kOp, "src", src));
  if (dst == nullptr || !dst->defined()) {
    return absl::InvalidArgumentError(
        "Convert: dst is null or undefined (the caller allocates it)");
  }
  LOOM_RETURN_IF_ERROR(CheckCpu(kOp, "dst", *dst));
  if (src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": src ", src.DebugString(), " and dst ",
                                                   dst->DebugString(),
                                                   " have different element counts"));
  }
  const int64_t n = src.numel();
  const DType from = src.dtype(), to = dst->dtype();
  if (from == to) {
    std::memcpy(dst->raw_data(), src.raw_data(), src.nbytes());
  } else if (from == DType::kF32 && to == DType::kBF16) {
    F32ToBf16(src.data<float>(), reinterpret_cast<uint16_t*>(dst->data<BFloat16>()), n);
  } else if (from == DType::kBF16 && to == DType::kF32) {
    Bf16ToF32(reinterpret_cast<const uint16_t*>(src.data<BFloat16>()), dst->data<float>(), n);
  } else if (from == DType::kF32 && to == DType::kF16) {
    F32ToF16(src.data<float>(), reinterpret_cast<uint16_t*>(dst->data<Float16>()), n);
  } else if (from == DType::kF16 && to == DType::kF32) {
    F16ToF32(reinterpret_cast<const uint16_t*>(src.data<Float16>()), dst->data<float>(), n);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": no conversion from ", src.DebugString(),
                                                   " to ", dst->DebugString(),
                                                   " (supported: f32<->bf16, f32<->f16)"));
  }
  return absl::OkStatus();
}

}  // namespace loom::core::cpu
