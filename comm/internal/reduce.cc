#include "comm/internal/reduce.h"

#include <algorithm>
#include <cstring>

#include "core/cpu/convert.h"

namespace loom::comm::internal {

using core::cpu::Bf16BitsToFloat;
using core::cpu::FloatToBf16Bits;

float F16ToF32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x47800000u) {  // >= 65536 (after rounding overflow): inf
    // values in [65520, 65536) round to inf too; handled by the normal path
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  int32_t exp = static_cast<int32_t>(abs >> 23) - 127 + 15;
  uint32_t mant = abs & 0x7fffffu;
  if (exp <= 0) {  // subnormal or zero
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = 1u << (shift - 1);
    uint32_t rounded = (mant + half - 1 + ((mant >> shift) & 1u)) >> shift;
    return static_cast<uint16_t>(sign | rounded);
  }
  uint32_t out = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (out & 1u))) ++out;  // may carry into inf: fine
  return static_cast<uint16_t>(sign | out);
}

namespace {

// dst may alias a (the in-place form); the loops are element-wise, so that
// is safe and still vectorises.
template <typename T, typename F>
void Apply(T* dst, const T* a, const T* b, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
}

template <typename T>
void ReduceTyped(T* dst, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      Apply(dst, a, b, n, [](T x, T y) { return static_cast<T>(x + y); });
      break;
    case ReduceOp::kProd:
      Apply(dst, a, b, n, [](T x, T y) { return static_cast<T>(x * y); });
      break;
    case ReduceOp::kMax:
      Apply(dst, a, b, n, [](T x, T y) { return std::max(x, y); });
      break;
    case ReduceOp::kMin:
      Apply(dst, a, b, n, [](T x, T y) { return std::min(x, y); });
      break;
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Reduce16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, ReduceOp op) {
  constexpr size_t kBlock = 256;
  float fa[kBlock], fb[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) {
      fa[i] = ToF(a[base + i]);
      fb[i] = ToF(b[base + i]);
    }
    ReduceTyped(fa, fa, fb, m, op);
    for (size_t i = 0; i < m; ++i) dst[base + i] = FromF(fa[i]);
  }
}

template <typename T>
void ReduceAs(void* dst, const void* a, const void* b, size_t count, ReduceOp op) {
  ReduceTyped(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count,
              op);
}

}  // namespace

void ReduceTo(void* dst, const void* a, const void* b, size_t count, core::DType dtype,
              ReduceOp op) {
  using core::DType;
  switch (dtype) {
    case DType::kF32: return ReduceAs<float>(dst, a, b, count, op);
    case DType::kF64: return ReduceAs<double>(dst, a, b, count, op);
    case DType::kI32: return ReduceAs<int32_t>(dst, a, b, count, op);
    case DType::kI64: return ReduceAs<int64_t>(dst, a, b, count, op);
    case DType::kU8: return ReduceAs<uint8_t>(dst, a, b, count, op);
    case DType::kBF16:
      return Reduce16<Bf16BitsToFloat, FloatToBf16Bits>(
          static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), count, op);
    case DType::kF16:
      return Reduce16<F16ToF32, F32ToF16>(static_cast<uint16_t*>(dst),
                                          static_cast<const uint16_t*>(a),
                                          static_cast<const uint16_t*>(b), count, op);
  }
}

void ReduceInto(void* acc, const void* src, size_t count, core::DType dtype, ReduceOp op) {
  ReduceTo(acc, acc, src, count, dtype, op);
}

namespace {
template <typename T>
void DivTyped(T* p, size_t n, int d) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(d));
}
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Div16(uint16_t* p, size_t n, int d) {
  for (size_t i = 0; i < n; ++i) p[i] = FromF(ToF(p[i]) / static_cast<float>(d));
}
}  // namespace

void FinishAvg(void* buf, size_t count, core::DType dtype, int n) {
  using core::DType;
  if (n == 1) return;
  switch (dtype) {
    case DType::kF32: return DivTyped(static_cast<float*>(buf), count, n);
    case DType::kF64: return DivTyped(static_cast<double*>(buf), count, n);
    case DType::kI32: return DivTyped(static_cast<int32_t*>(buf), count, n);
    case DType::kI64: return DivTyped(static_cast<int64_t*>(buf), count, n);
    case DType::kU8: return DivTyped(static_cast<uint8_t*>(buf), count, n);
    case DType::kBF16:
      return Div16<Bf16BitsToFloat, FloatToBf16Bits>(static_cast<uint16_t*>(buf), count, n);
    case DType::kF16: return Div16<F16ToF32, F32ToF16>(static_cast<uint16_t*>(buf), count, n);
  }
}

}  // namespace loom::comm::internal
