#include "comm/internal/reduce.h"

#include <algorithm>
#include <cstring>

namespace loom::comm::internal {

float Bf16ToF32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToBf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

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

template <typename T, typename F>
void Apply(T* acc, const T* src, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], src[i]);
}

template <typename T>
void ReduceTyped(T* acc, const T* src, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      Apply(acc, src, n, [](T a, T b) { return static_cast<T>(a + b); });
      break;
    case ReduceOp::kProd:
      Apply(acc, src, n, [](T a, T b) { return static_cast<T>(a * b); });
      break;
    case ReduceOp::kMax:
      Apply(acc, src, n, [](T a, T b) { return std::max(a, b); });
      break;
    case ReduceOp::kMin:
      Apply(acc, src, n, [](T a, T b) { return std::min(a, b); });
      break;
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Reduce16(uint16_t* acc, const uint16_t* src, size_t n, ReduceOp op) {
  constexpr size_t kBlock = 256;
  float a[kBlock], b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) {
      a[i] = ToF(acc[base + i]);
      b[i] = ToF(src[base + i]);
    }
    ReduceTyped(a, b, m, op);
    for (size_t i = 0; i < m; ++i) acc[base + i] = FromF(a[i]);
  }
}

}  // namespace

void ReduceInto(void* acc, const void* src, size_t count, core::DType dtype, ReduceOp op) {
  using core::DType;
  switch (dtype) {
    case DType::kF32:
      return ReduceTyped(static_cast<float*>(acc), static_cast<const float*>(src), count, op);
    case DType::kF64:
      return ReduceTyped(static_cast<double*>(acc), static_cast<const double*>(src), count, op);
    case DType::kI32:
      return ReduceTyped(static_cast<int32_t*>(acc), static_cast<const int32_t*>(src), count, op);
    case DType::kI64:
      return ReduceTyped(static_cast<int64_t*>(acc), static_cast<const int64_t*>(src), count, op);
    case DType::kU8:
      return ReduceTyped(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(src), count, op);
    case DType::kBF16:
      return Reduce16<Bf16ToF32, F32ToBf16>(static_cast<uint16_t*>(acc),
                                            static_cast<const uint16_t*>(src), count, op);
    case DType::kF16:
      return Reduce16<F16ToF32, F32ToF16>(static_cast<uint16_t*>(acc),
                                          static_cast<const uint16_t*>(src), count, op);
  }
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
    case DType::kBF16: return Div16<Bf16ToF32, F32ToBf16>(static_cast<uint16_t*>(buf), count, n);
    case DType::kF16: return Div16<F16ToF32, F32ToF16>(static_cast<uint16_t*>(buf), count, n);
  }
}

}  // namespace loom::comm::internal
