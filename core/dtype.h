#ifndef LOOM_CORE_DTYPE_H_
#define LOOM_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace loom::core {

// Element types a tensor can hold. The numeric values are stable: they are
// written into checkpoints and sent between ranks to check agreement.
enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kI32 = 3,
  kI64 = 4,
  kU8 = 5,
  kF64 = 6,  // used by reductions and collectives (comm conformance)
};

// Storage-only 16-bit float types: arithmetic happens in f32 (see bf16.h).
struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "f32", "bf16", ...
bool IsFloating(DType dtype);

// Maps a C++ element type to its DType, for typed accessors:
// DTypeOf<float>::value == DType::kF32.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> : std::integral_constant<DType, DType::kF32> {};
template <>
struct DTypeOf<double> : std::integral_constant<DType, DType::kF64> {};
template <>
struct DTypeOf<BFloat16> : std::integral_constant<DType, DType::kBF16> {};
template <>
struct DTypeOf<Float16> : std::integral_constant<DType, DType::kF16> {};
template <>
struct DTypeOf<int32_t> : std::integral_constant<DType, DType::kI32> {};
template <>
struct DTypeOf<int64_t> : std::integral_constant<DType, DType::kI64> {};
template <>
struct DTypeOf<uint8_t> : std::integral_constant<DType, DType::kU8> {};

}  // namespace loom::core

#endif  // LOOM_CORE_DTYPE_H_
