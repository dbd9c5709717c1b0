#include "core/cuda/linear.h"

#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda/blaslt.h"
#include "core/cuda/check_args.h"
#include "core/cuda/convert.h"
#include "core/cuda/elementwise.h"
#include "core/cuda/matmul.h"
#include "core/ops/contracts/shape_checks.h"

namespace loom::core::cuda {
namespace {

using internal::CheckDevices;
using internal::Epilogue;
using internal::LtGemmArgs;

constexpr const char* kForward = "LinearForward";
constexpr const char* kData = "LinearBackwardData";
constexpr const char* kWeight = "LinearBackwardWeight";

// dtypes: the GEMM operands and activations of one float dtype (as the
// unfused kernels require); a parameter gradient of theirs or f32.
absl::Status CheckForwardTypes(const Tensor& x, const Tensor& w, const Tensor& bias,
                               const Tensor* y, const Tensor* pre) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kForward, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kForward, "x", x, "w", w));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kForward, "x", x, "y", *y));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kForward, "x", x, "bias", bias));
  if (pre != nullptr) {
    LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kForward, "x", x, "pre", *pre));
    LOOM_RETURN_IF_ERROR(CheckDevices(kForward, {{"x", &x}, {"pre", pre}}));
  }
  return CheckDevices(kForward, {{"x", &x}, {"w", &w}, {"bias", &bias}, {"y", y}});
}

absl::Status CheckDataTypes(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor* dx,
                            const Tensor* dbias, bool gelu) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kData, "dy", dy));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kData, "dy", dy, "w", w));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kData, "dy", dy, "dx", *dx));
  if (gelu) LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kData, "dy", dy, "pre", pre));
  if (dbias != nullptr) LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kData, "dy", dy, "dbias", *dbias));
  LOOM_RETURN_IF_ERROR(CheckDevices(kData, {{"dy", &dy}, {"w", &w}, {"dx", dx}}));
  if (gelu) LOOM_RETURN_IF_ERROR(CheckDevices(kData, {{"dy", &dy}, {"pre", &pre}}));
  if (dbias != nullptr) LOOM_RETURN_IF_ERROR(CheckDevices(kData, {{"dy", &dy}, {"dbias", dbias}}));
  return absl::OkStatus();
}

absl::Status CheckWeightTypes(const Tensor& dy, const Tensor& x, const Tensor* dw,
                              const Tensor* dbias) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kWeight, "dy", dy));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kWeight, "dy", dy, "x", x));
  LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kWeight, "dy", dy, "dw", *dw));
  if (dbias != nullptr) {
    LOOM_RETURN_IF_ERROR(internal::CheckSameOrF32(kWeight, "dy", dy, "dbias", *dbias));
    LOOM_RETURN_IF_ERROR(CheckDevices(kWeight, {{"dy", &dy}, {"dbias", dbias}}));
  }
  return CheckDevices(kWeight, {{"dy", &dy}, {"x", &x}, {"dw", dw}});
}

// Unimplemented from LtGemm (no algorithm): run the unfused kernels, said once per reason.
bool FallBack(const absl::Status& s) {
  if (!absl::IsUnimplemented(s)) return false;
  static std::mutex mu;
  static std::set<std::string>* said = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(mu);
  const std::string why(s.message());
  if (said->insert(why).second) {
    std::fprintf(stderr, "loom: %s; running the unfused kernels\n", why.c_str());
  }
  return true;
}

// dbias += v, where v is the bias gradient cuBLASLt wrote in its output dtype.
absl::Status AccumulateBias(const Tensor& v, Tensor* dbias) {
  if (v.dtype() == dbias->dtype()) return Add(*dbias, v, dbias);
  LOOM_ASSIGN_OR_RETURN(Tensor f32, internal::Scratch(v.shape(), dbias->dtype()));
  LOOM_RETURN_IF_ERROR(Convert(v, &f32));
  return Add(*dbias, f32, dbias);
}

}  // namespace

// ------------------------------------------------------------ unfused

absl::Status LinearForwardUnfused(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor* y,
                                  Tensor* pre, const ops::LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(ops::CheckLinearForward(kForward, x, w, bias, y, pre, opts));
  Tensor* z = opts.gelu ? pre : y;
  LOOM_RETURN_IF_ERROR(Matmul(x, w, z, ops::MatmulOptions{false, true}));
  LOOM_RETURN_IF_ERROR(BiasAddForward(*z, bias, z));
  if (opts.gelu) LOOM_RETURN_IF_ERROR(GeluForward(*pre, y));
  return absl::OkStatus();
}

absl::Status LinearBackwardDataUnfused(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                       Tensor* dx, Tensor* dbias, const ops::LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(ops::CheckLinearBackwardData(kData, dy, w, pre, dx, dbias, opts));
  LOOM_RETURN_IF_ERROR(Matmul(dy, w, dx));
  if (opts.gelu) LOOM_RETURN_IF_ERROR(GeluBackward(pre, *dx, dx));
  if (dbias != nullptr) LOOM_RETURN_IF_ERROR(BiasAddBackward(*dx, dbias));
  return absl::OkStatus();
}

absl::Status LinearBackwardWeightUnfused(const Tensor& dy, const Tensor& x, Tensor* dw,
                                         Tensor* dbias, const ops::LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(ops::CheckLinearBackwardWeight(kWeight, dy, x, dw, dbias, opts));
  LOOM_RETURN_IF_ERROR(Matmul(dy, x, dw, ops::MatmulOptions{true, false, 1.0f, 1.0f}));
  if (dbias != nullptr) LOOM_RETURN_IF_ERROR(BiasAddBackward(dy, dbias));
  return absl::OkStatus();
}

// ------------------------------------------------------------ cuBLASLt

absl::Status LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor* y,
                           Tensor* pre, const ops::LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(ops::CheckLinearForward(kForward, x, w, bias, y, pre, opts));
  LOOM_RETURN_IF_ERROR(CheckForwardTypes(x, w, bias, y, pre));
  const int64_t n = x.dim(0), m = w.dim(0), k = w.dim(1);
  if (n == 0 || m == 0) return absl::OkStatus();
  if (k > 0) {
    // y[n, m] = x[n, k]·w[m, k]ᵀ (+ bias [m], GELU keeping pre).
    LtGemmArgs g;
    g.trans_b = true;
    g.m = n;
    g.n = m;
    g.k = k;
    g.a = x.raw_data();
    g.lda = k;
    g.b = w.raw_data();
    g.ldb = k;
    g.c = y->raw_data();
    g.ldc = m;
    g.ab = g.c_dtype = x.dtype();
    g.epilogue = opts.gelu ? Epilogue::kGeluAuxBias : Epilogue::kBias;
    g.bias = const_cast<void*>(bias.raw_data());
    if (opts.gelu) {
      g.aux = pre->raw_data();
      g.ldaux = m;
    }
    const absl::Status s = internal::LtGemm(kForward, g);
    if (!FallBack(s)) return s;
  }
  return LinearForwardUnfused(x, w, bias, y, pre, opts);
}

absl::Status LinearBackwardData(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor* dx,
                                Tensor* dbias, const ops::LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(ops::CheckLinearBackwardData(kData, dy, w, pre, dx, dbias, opts));
  LOOM_RETURN_IF_ERROR(CheckDataTypes(dy, w, pre, dx, dbias, opts.gelu));
  const int64_t n = dy.dim(0), m = w.dim(0), k = w.dim(1);
  if (n == 0 || k == 0) return absl::OkStatus();
  if (m > 0 && opts.gelu) {
    // dx[n, k] = gelu'(pre) ⊙ dy[n, m]·w[m, k]; bias gradient Σ_rows dx [k].
    Tensor bgrad;
    if (dbias != nullptr) {
      LOOM_ASSIGN_OR_RETURN(bgrad, internal::Scratch(Shape{k}, dx->dtype()));
    }
    LtGemmArgs g;
    g.m = n;
    g.n = k;
    g.k = m;
    g.a = dy.raw_data();
    g.lda = m;
    g.b = w.raw_data();
    g.ldb = k;
    g.c = dx->raw_data();
    g.ldc = k;
    g.ab = g.c_dtype = dy.dtype();
    g.epilogue = dbias != nullptr ? Epilogue::kDGeluBGrad : Epilogue::kDGelu;
    g.bias = dbias != nullptr ? bgrad.raw_data() : nullptr;
    g.aux = const_cast<void*>(pre.raw_data());
    g.ldaux = k;
    const absl::Status s = internal::LtGemm(kData, g);
    if (s.ok()) return dbias != nullptr ? AccumulateBias(bgrad, dbias) : s;
    if (!FallBack(s)) return s;
  }
  return LinearBackwardDataUnfused(dy, w, pre, dx, dbias, opts);
}

absl::Status LinearBackwardWeight(const Tensor& dy, const Tensor& x, Tensor* dw, Tensor* dbias,
                                  const ops::LinearOptions& opts) {
  LOOM_RETURN_IF_ERROR(ops::CheckLinearBackwardWeight(kWeight, dy, x, dw, dbias, opts));
  LOOM_RETURN_IF_ERROR(CheckWeightTypes(dy, x, dw, dbias));
  const int64_t rows = dy.dim(0), m = dy.dim(1), k = x.dim(1);
  if (m == 0 || k == 0) return absl::OkStatus();
  if (rows > 0 && dbias != nullptr) {
    // dw[m, k] += dy[rows, m]ᵀ·x[rows, k]; bias gradient Σ_rows dy [m] (BGRADB).
    LOOM_ASSIGN_OR_RETURN(Tensor bgrad, internal::Scratch(Shape{m}, dw->dtype()));
    LtGemmArgs g;
    g.trans_a = true;
    g.m = m;
    g.n = k;
    g.k = rows;
    g.beta = 1.0f;
    g.a = dy.raw_data();
    g.lda = m;
    g.b = x.raw_data();
    g.ldb = k;
    g.c = dw->raw_data();
    g.ldc = k;
    g.ab = dy.dtype();
    g.c_dtype = dw->dtype();
    g.epilogue = Epilogue::kBGradOfA;
    g.bias = bgrad.raw_data();
    const absl::Status s = internal::LtGemm(kWeight, g);
    if (s.ok()) return AccumulateBias(bgrad, dbias);
    if (!FallBack(s)) return s;
  }
  return LinearBackwardWeightUnfused(dy, x, dw, dbias, opts);
}

}  // namespace loom::core::cuda
