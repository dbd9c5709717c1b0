#ifndef LOOM_CORE_CPU_CHECK_H_
#define LOOM_CORE_CPU_CHECK_H_

// Argument checks shared by the CPU kernels. Every failure is an
// InvalidArgument that names the op, the argument and its shape.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/status_macros.h"  // LOOM_RETURN_IF_ERROR: how the kernels chain these checks
#include "core/tensor.h"

namespace loom::core::cpu::internal {

// Defined, on the CPU, of `dtype`.
absl::Status CheckInput(const char* op, const char* arg, const Tensor& t,
                        DType dtype = DType::kF32);
// As CheckInput, and `t` is not null (an output argument).
absl::Status CheckOutput(const char* op, const char* arg, const Tensor* t,
                         DType dtype = DType::kF32);
// Defined, on the CPU, of dtype i32 or i64 (token ids / targets).
absl::Status CheckIndex(const char* op, const char* arg, const Tensor& t);
// `t` has exactly `numel` elements (core/ops/contracts/shape_checks.h).
using ops::CheckNumel;
// "f32[2, 3] cpu" or "undefined".
std::string Describe(const Tensor& t);
// Reads element i of an i32 or i64 tensor as int64.
inline int64_t IndexAt(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI32 ? static_cast<int64_t>(t.data<int32_t>()[i])
                                  : t.data<int64_t>()[i];
}

}  // namespace loom::core::cpu::internal

#endif  // LOOM_CORE_CPU_CHECK_H_
