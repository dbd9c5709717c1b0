#include "core/cuda/matmul.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/blas.h"
#include "core/cuda/check.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

using ops::GemmDims;
using internal::CheckDevices;

absl::Status CheckTypes(const char* op, const Tensor& a, const Tensor& b, const Tensor* c) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "a", a));
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "b", b));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(op, "c", c));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(op, "a", a, "b", b));
  return internal::CheckSameOrF32(op, "a", a, "c", *c);
}

// K == 0: C = beta C (cuBLAS's behaviour there is not something to rely on).
absl::Status EmptyInner(const char* op, float beta, Tensor* c) {
  absl::StatusOr<cudaStream_t> stream = internal::Stream();
  if (!stream.ok()) return stream.status();
  if (c->nbytes() == 0) return absl::OkStatus();
  if (beta == 0.0f) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c->raw_data(), 0, c->nbytes(), *stream));
    return absl::OkStatus();
  }
  LOOM_CUDA_LAUNCH(op, kernels::Scale(internal::ElemOf(c->dtype()), beta, c->raw_data(),
                                      c->numel(), *stream));
  return absl::OkStatus();
}

internal::GemmArgs Args(const Tensor& a, const Tensor& b, Tensor* c, const cpu::MatmulOptions& o,
                        const GemmDims& d) {
  const int r = a.rank();
  internal::GemmArgs g;
  g.trans_a = o.trans_a;
  g.trans_b = o.trans_b;
  g.m = d.m;
  g.n = d.n;
  g.k = d.k;
  g.alpha = o.alpha;
  g.beta = o.beta;
  g.a = a.raw_data();
  g.lda = a.dim(r - 1);
  g.stride_a = a.dim(r - 2) * a.dim(r - 1);
  g.b = b.raw_data();
  g.ldb = b.dim(r - 1);
  g.stride_b = b.dim(r - 2) * b.dim(r - 1);
  g.c = c->raw_data();
  g.ldc = c->dim(r - 1);
  g.stride_c = c->dim(r - 2) * c->dim(r - 1);
  g.ab = a.dtype();
  g.c_dtype = c->dtype();
  return g;
}

}  // namespace

absl::Status Matmul(const Tensor& a, const Tensor& b, Tensor* c, const cpu::MatmulOptions& opts) {
  constexpr const char* kOp = "Matmul";
  LOOM_RETURN_IF_ERROR(CheckTypes(kOp, a, b, c));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "a", a, 2));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "b", b, 2));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "c", *c, 2));
  GemmDims d;
  LOOM_RETURN_IF_ERROR(ops::GemmMatrixDims(kOp, a, b, *c, opts, &d));
  LOOM_RETURN_IF_ERROR(CheckDevices(kOp, {{"a", &a}, {"b", &b}, {"c", c}}));
  if (d.m == 0 || d.n == 0) return absl::OkStatus();
  if (d.k == 0) return EmptyInner(kOp, opts.beta, c);
  return internal::Gemm(kOp, Args(a, b, c, opts, d));
}

absl::Status BatchedMatmul(const Tensor& a, const Tensor& b, Tensor* c,
                           const cpu::MatmulOptions& opts) {
  constexpr const char* kOp = "BatchedMatmul";
  LOOM_RETURN_IF_ERROR(CheckTypes(kOp, a, b, c));
  LOOM_ASSIGN_OR_RETURN(const int64_t batch, ops::GemmBatchCount(kOp, a, b, *c));
  GemmDims d;
  LOOM_RETURN_IF_ERROR(ops::GemmMatrixDims(kOp, a, b, *c, opts, &d));
  LOOM_RETURN_IF_ERROR(CheckDevices(kOp, {{"a", &a}, {"b", &b}, {"c", c}}));
  if (d.m == 0 || d.n == 0 || batch == 0) return absl::OkStatus();
  if (d.k == 0) return EmptyInner(kOp, opts.beta, c);
  internal::GemmArgs g = Args(a, b, c, opts, d);
  g.batch = batch;
  return internal::Gemm(kOp, g);
}

}  // namespace loom::core::cuda
