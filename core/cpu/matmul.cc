#include "core/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/bf16_gemm.h"
#include "core/cpu/check.h"
#include "core/cpu/convert.h"
#include "core/cpu/cpu_features.h"
#include "oneapi/dnnl/dnnl.h"

namespace loom::core::cpu {
namespace {

using internal::CheckInput;
using internal::CheckOutput;

// Columns of C per oneDNN call for an NT product wider than this (Matmul).
constexpr int64_t kWideNtColumns = 768;

absl::Status CheckAll(const char* op, const Tensor& a, const Tensor& b, const Tensor* c) {
  LOOM_RETURN_IF_ERROR(CheckInput(op, "a", a));
  LOOM_RETURN_IF_ERROR(CheckInput(op, "b", b));
  return CheckOutput(op, "c", c);
}

// Per-thread scratch for operands rounded to bf16 and a bf16 result's f32 sums.
struct Bf16Scratch {
  std::vector<uint16_t> a, b;
  std::vector<float> c;
};

Bf16Scratch& Scratch() {
  thread_local Bf16Scratch scratch;
  return scratch;
}

// `t` as bf16 bits: its own data, or rounded into `buf`.
const uint16_t* AsBf16(const Tensor& t, std::vector<uint16_t>* buf) {
  if (t.dtype() == DType::kBF16) return static_cast<const uint16_t*>(t.raw_data());
  if (buf->size() < static_cast<size_t>(t.numel())) buf->resize(t.numel());
  ConvertF32ToBf16(t.data<float>(), buf->data(), t.numel());
  return buf->data();
}

absl::Status CheckFloat(const char* op, const char* arg, const Tensor& t) {
  return CheckInput(op, arg, t, t.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32);
}

absl::Status MatmulBf16(const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts) {
  constexpr const char* kOp = "Matmul";
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "a", a));
  LOOM_RETURN_IF_ERROR(CheckFloat(kOp, "b", b));
  LOOM_RETURN_IF_ERROR(CheckOutput(kOp, "c", c, c != nullptr && c->defined() &&
                                                         c->dtype() == DType::kBF16
                                                     ? DType::kBF16
                                                     : DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "a", a, 2));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "b", b, 2));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "c", *c, 2));
  ops::GemmDims d;
  LOOM_RETURN_IF_ERROR(ops::GemmMatrixDims(kOp, a, b, *c, opts, &d));
  LOOM_RETURN_IF_ERROR(CheckBf16GemmSupport("Matmul in bf16 on the CPU"));
  Bf16Scratch& s = Scratch();
  const uint16_t* pa = AsBf16(a, &s.a);
  const uint16_t* pb = AsBf16(b, &s.b);
  if (c->dtype() == DType::kF32) {
    return Bf16Gemm(opts.trans_a, opts.trans_b, d.m, d.n, d.k, opts.alpha, pa, a.dim(1), pb,
                    b.dim(1), opts.beta, c->data<float>(), c->dim(1));
  }
  // bf16 result: sum in f32, round once.
  const int64_t cn = c->numel();
  if (s.c.size() < static_cast<size_t>(cn)) s.c.resize(cn);
  uint16_t* pc = static_cast<uint16_t*>(c->raw_data());
  if (opts.beta != 0.0f) {
    for (int64_t i = 0; i < cn; ++i) s.c[i] = Bf16BitsToFloat(pc[i]);
  }
  LOOM_RETURN_IF_ERROR(Bf16Gemm(opts.trans_a, opts.trans_b, d.m, d.n, d.k, opts.alpha, pa,
                                a.dim(1), pb, b.dim(1), opts.beta, s.c.data(), c->dim(1)));
  ConvertF32ToBf16(s.c.data(), pc, cn);
  return absl::OkStatus();
}

}  // namespace


absl::Status Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    // oneDNN may not scale C when K == 0; do it here (beta == 0 overwrites).
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return absl::OkStatus();
  }
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                      lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    return absl::InternalError(absl::StrCat("Sgemm: dnnl_sgemm failed with status ",
                                            static_cast<int>(st), " for M=", m, " N=", n, " K=", k,
                                            " lda=", lda, " ldb=", ldb, " ldc=", ldc));
  }
  return absl::OkStatus();
}

absl::Status Matmul(const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts) {
  constexpr const char* kOp = "Matmul";
  if (opts.bf16 || a.dtype() == DType::kBF16 || b.dtype() == DType::kBF16) {
    return MatmulBf16(a, b, c, opts);
  }
  LOOM_RETURN_IF_ERROR(CheckAll(kOp, a, b, c));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "a", a, 2));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "b", b, 2));
  LOOM_RETURN_IF_ERROR(CheckRank(kOp, "c", *c, 2));
  ops::GemmDims d;
  LOOM_RETURN_IF_ERROR(ops::GemmMatrixDims(kOp, a, b, *c, opts, &d));
  if (!opts.trans_a && opts.trans_b && d.n > kWideNtColumns) {
    // Y = X·Wᵀ with a wide W (the output layer: 50257 rows) in slices of W's
    // rows. oneDNN's AVX2 sgemm ran the whole 256 x 50257 x 768 product at
    // 150 GFLOP/s and 768-row slices at 183 (BLIS 185, OpenBLAS 198) on two
    // cores; with AVX-512 the slices ran 300-327 against 304 whole.
    for (int64_t j = 0; j < d.n; j += kWideNtColumns) {
      LOOM_RETURN_IF_ERROR(Sgemm(false, true, d.m, std::min(kWideNtColumns, d.n - j), d.k,
                                 opts.alpha, a.data<float>(), a.dim(1),
                                 b.data<float>() + j * b.dim(1), b.dim(1), opts.beta,
                                 c->data<float>() + j, c->dim(1)));
    }
    return absl::OkStatus();
  }
  return Sgemm(opts.trans_a, opts.trans_b, d.m, d.n, d.k, opts.alpha, a.data<float>(), a.dim(1),
               b.data<float>(), b.dim(1), opts.beta, c->data<float>(), c->dim(1));
}

absl::Status BatchedMatmul(const Tensor& a, const Tensor& b, Tensor* c, const MatmulOptions& opts) {
  constexpr const char* kOp = "BatchedMatmul";
  LOOM_RETURN_IF_ERROR(CheckAll(kOp, a, b, c));
  const int r = a.rank();
  absl::StatusOr<int64_t> batches = ops::GemmBatchCount(kOp, a, b, *c);
  if (!batches.ok()) return batches.status();
  const int64_t batch = *batches;
  ops::GemmDims d;
  LOOM_RETURN_IF_ERROR(ops::GemmMatrixDims(kOp, a, b, *c, opts, &d));
  const int64_t lda = a.dim(r - 1), ldb = b.dim(r - 1), ldc = c->dim(r - 1);
  const int64_t sa = a.dim(r - 2) * lda, sb = b.dim(r - 2) * ldb, sc = d.m * ldc;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = c->data<float>();
  // Many small products: one per thread (oneDNN then runs single-threaded).
  // Few or large ones: one after the other, each using every thread.
  const bool outer = batch >= omp_get_max_threads() && d.m * d.n * d.k <= (int64_t{1} << 24);
  if (!outer) {
    for (int64_t i = 0; i < batch; ++i) {
      LOOM_RETURN_IF_ERROR(Sgemm(opts.trans_a, opts.trans_b, d.m, d.n, d.k, opts.alpha,
                                 pa + i * sa, lda, pb + i * sb, ldb, opts.beta, pc + i * sc,
                                 ldc));
    }
    return absl::OkStatus();
  }
  int failed = 0;
  absl::Status first_error;
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < batch; ++i) {
    absl::Status s = Sgemm(opts.trans_a, opts.trans_b, d.m, d.n, d.k, opts.alpha, pa + i * sa, lda,
                           pb + i * sb, ldb, opts.beta, pc + i * sc, ldc);
    if (!s.ok()) {
#pragma omp critical
      {
        if (!failed++) first_error = s;
      }
    }
  }
  return first_error;
}

}  // namespace loom::core::cpu
