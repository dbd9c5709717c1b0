#include "core/cpu/check.h"

#include <cstdlib>
#include <cstring>

#include "core/cpu/vec_math.h"

namespace loom::core::cpu::internal {

absl::Status CheckInput(const char* op, const char* arg, const Tensor& t, DType dtype) {
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(op, arg, t, dtype));
  return CheckCpu(op, arg, t);
}

absl::Status CheckOutput(const char* op, const char* arg, const Tensor* t, DType dtype) {
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": output ", arg, " is null (the caller allocates outputs)"));
  }
  return CheckInput(op, arg, *t, dtype);
}

absl::Status CheckIndex(const char* op, const char* arg, const Tensor& t) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is undefined"));
  if (t.dtype() != DType::kI32 && t.dtype() != DType::kI64) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " is ", t.DebugString(), ", expected dtype i32 or i64"));
  }
  return CheckCpu(op, arg, t);
}

bool UseAvx512() {
  static const bool use = [] {
    const char* off = std::getenv("LOOM_CPU_NO_AVX512");
    if (off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return use;
}

std::string Describe(const Tensor& t) { return t.defined() ? t.DebugString() : "undefined"; }

}  // namespace loom::core::cpu::internal
