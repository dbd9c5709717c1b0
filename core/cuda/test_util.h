#ifndef LOOM_CORE_CUDA_TEST_UTIL_H_
#define LOOM_CORE_CUDA_TEST_UTIL_H_

// Helpers for the CUDA kernel tests: the CPU kernels (core/cpu) are the
// oracle. Inputs are made on the CPU in f32, rounded to the test dtype, run
// through the CPU kernel in f32 and through the CUDA kernel in the test
// dtype; outputs are poisoned (0xff bytes = NaN in f32 and bf16) before each
// GPU run so an element a kernel forgets to write fails the comparison.

#include <vector>

#include "absl/status/status.h"
#include "core/cpu/test_util.h"  // LOOM_ASSERT_OK and the CPU-side helpers below
#include "core/tensor.h"
#include "gtest/gtest.h"

// Skips the test (visible in the log, with the reason) without a GPU.
#define LOOM_REQUIRE_GPU()                                                        \
  do {                                                                            \
    const ::absl::Status loom_gpu_ = ::loom::core::cuda::testing::GpuStatus();    \
    if (!loom_gpu_.ok()) GTEST_SKIP() << "needs a CUDA GPU: " << loom_gpu_;       \
  } while (0)

namespace loom::core::cuda::testing {

// OK when a CUDA device is visible (and makes device 0 current).
absl::Status GpuStatus();

// Shared with the CPU kernel tests (core/cpu/test_util.h): CPU inputs made by
// Random (f32 uniform in [lo, hi), reproducible from a seed), FromValues (f32)
// and Ids (i32 / i64), and IsInvalidArgument (an InvalidArgument whose
// message contains every needle).
using ::loom::core::cpu::testing::FromValues;
using ::loom::core::cpu::testing::Ids;
using ::loom::core::cpu::testing::IsInvalidArgument;
using ::loom::core::cpu::testing::Random;

// CPU f32 copy whose values are exactly representable in `dtype` (f32: a copy).
Tensor RoundedTo(const Tensor& f32, DType dtype);
// A CPU tensor of any dtype.
Tensor CpuEmpty(const Shape& shape, DType dtype);
// CPU f32 -> CUDA tensor of `dtype` (converted on the CPU first).
Tensor ToGpu(const Tensor& f32, DType dtype);
// Any CPU tensor -> CUDA, same dtype.
Tensor Upload(const Tensor& t);
// CUDA tensor of shape/dtype filled with 0xff bytes (NaN).
Tensor Poisoned(const Shape& shape, DType dtype);
// CUDA (or CPU) float tensor -> CPU f32.
Tensor ToCpuF32(const Tensor& t);
// Any CUDA tensor -> CPU, same dtype.
Tensor Download(const Tensor& t);

// cpu::testing::RelError of two CPU f32 tensors: max |got - want| / max |want|
// (NaN anywhere: infinity).
double RelError(const Tensor& got, const Tensor& want);
// Relative tolerance for a dtype: f32 ~1e-5, bf16 1e-2.
double Tol(DType dtype, double f32_tol = 1e-5, double bf16_tol = 1e-2);

// The dtypes every float kernel is tested in.
inline std::vector<DType> FloatTypes() { return {DType::kF32, DType::kBF16}; }

}  // namespace loom::core::cuda::testing

#endif  // LOOM_CORE_CUDA_TEST_UTIL_H_
