#include "core/cpu/adamw.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cpu/check.h"
#include "core/cpu/convert.h"

namespace loom::core::cpu {
namespace {

// AdamWStep, its errors naming `kOp`.
absl::Status Update(const char* kOp, Tensor* param, const Tensor& grad, Tensor* m, Tensor* v,
                    int64_t step, const AdamWOptions& opts) {
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "param", param));
  LOOM_RETURN_IF_ERROR(internal::CheckInput(kOp, "grad", grad));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "m", m));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "v", v));
  const int64_t n = param->numel();
  const std::string why = absl::StrCat("same as param ", param->DebugString());
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "grad", grad, n, why));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "m", *m, n, why));
  LOOM_RETURN_IF_ERROR(internal::CheckNumel(kOp, "v", *v, n, why));
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": step is ", step, ", expected >= 1 (the first step is 1)"));
  }
  const double t = static_cast<double>(step);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(opts.beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(opts.beta2), t));
  const float step_size = opts.lr / bc1;
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(bc2)));
  const float b1 = opts.beta1, b2 = opts.beta2, eps = opts.eps, gs = opts.grad_scale;
  const float decay = opts.lr * opts.weight_decay;
  float* pp = param->data<float>();
  const float* pg = grad.data<float>();
  float* pm = m->data<float>();
  float* pv = v->data<float>();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = pg[i] * gs;
    const float mi = b1 * pm[i] + (1.0f - b1) * g;
    const float vi = b2 * pv[i] + (1.0f - b2) * g * g;
    pm[i] = mi;
    pv[i] = vi;
    const float p = pp[i];
    pp[i] = p - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps) - decay * p;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const AdamWOptions& opts) {
  return Update("AdamWStep", param, grad, m, v, step, opts);
}

absl::Status AdamWStepWithCopy(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v,
                               int64_t step, const AdamWOptions& opts, Tensor* param_copy) {
  constexpr const char* kOp = "AdamWStepWithCopy";
  // Every check before the update, so a refused call changes nothing.
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "param", param));
  LOOM_RETURN_IF_ERROR(ops::CheckParamCopy(kOp, *param, param_copy));
  LOOM_RETURN_IF_ERROR(internal::CheckOutput(kOp, "param_copy", param_copy, DType::kBF16));
  LOOM_RETURN_IF_ERROR(Update(kOp, param, grad, m, v, step, opts));
  return Convert(*param, param_copy);
}

}  // namespace loom::core::cpu
