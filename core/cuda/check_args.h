#ifndef LOOM_CORE_CUDA_CHECK_ARGS_H_
#define LOOM_CORE_CUDA_CHECK_ARGS_H_

// Argument checks and launch plumbing shared by the CUDA kernels' host
// wrappers. Every check runs on the host before any CUDA call, and every
// failure is an InvalidArgument naming the op, the argument and its shape.
// Order: dtypes and shapes first, then placement (CUDA, one device, the
// current one), then the stream: bad input never touches the GPU.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/kernels.h"
#include "core/ops/contracts/options.h"
#include "core/ops/contracts/shape_checks.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace loom::core::cuda::internal {

// Defined and of dtype f32 or bf16 (the kernels' activation types).
absl::Status CheckFloat(const char* op, const char* arg, const Tensor& t);
// Non-null output, as CheckFloat.
absl::Status CheckFloatOut(const char* op, const char* arg, const Tensor* t);
// Defined and of exactly `dtype` (t may be an output: null is an error).
absl::Status CheckIs(const char* op, const char* arg, const Tensor* t, DType dtype);
// Defined, i32 or i64.
absl::Status CheckIds(const char* op, const char* arg, const Tensor& t);
// b has a's dtype.
absl::Status CheckSameDType(const char* op, const char* a_name, const Tensor& a,
                            const char* b_name, const Tensor& b);
// b has a's dtype, or f32 (parameter gradients may be kept in f32).
absl::Status CheckSameOrF32(const char* op, const char* a_name, const Tensor& a,
                            const char* b_name, const Tensor& b);
// (Element counts: ops::CheckNumel, core/ops/contracts/shape_checks.h.)
// `rows` fits a one-block-per-row grid (< 2^31).
absl::Status CheckRows(const char* op, const char* what, int64_t rows);
// The chunk count kernels::ColumnPartials takes for `rows` rows of `arg`
// (named in the error): at most 65535, the grid's y limit.
absl::StatusOr<int64_t> CheckColumnChunks(const char* op, const char* arg, const Tensor& t,
                                          int64_t rows);

struct Arg {
  const char* name;
  const Tensor* t;
};
// Every tensor is a CUDA tensor, all on one device, the calling thread's current one.
absl::Status CheckDevices(const char* op, std::initializer_list<Arg> args);
// The element-wise contract: every argument is a float tensor (outputs
// non-null) with the first one's dtype and shape. Errors as CheckFloat(Out),
// CheckSameDType and CheckSameShape, in that order over all arguments.
absl::Status CheckAlike(const char* op, std::initializer_list<Arg> args);

// The kernels' attention mask and dropout parameters for this call's heads
// (the dropout mask at global probability indices, as the CPU's).
kernels::AttentionMask AttentionMaskOf(const ops::AttentionDropout& dropout, int64_t heads);

// The address `elems` elements after t's first (strided sub-matrices).
const void* ElementAt(const Tensor& t, int64_t elems);
void* ElementAt(Tensor* t, int64_t elems);

kernels::Elem ElemOf(DType dtype);     // f32, bf16, f16
kernels::Index IndexOf(DType dtype);   // i32, i64

// The calling thread's compute stream.
absl::StatusOr<cudaStream_t> Stream();
// Internal error naming the op when a launch failed.
absl::Status Launched(const char* op, cudaError_t err);
// A temporary on the current device (reused in stream order, see allocator.h).
absl::StatusOr<Tensor> Scratch(const Shape& shape, DType dtype);

}  // namespace loom::core::cuda::internal

#define LOOM_CUDA_LAUNCH(op, expr) LOOM_RETURN_IF_ERROR(::loom::core::cuda::internal::Launched(op, (expr)))

#endif  // LOOM_CORE_CUDA_CHECK_ARGS_H_
