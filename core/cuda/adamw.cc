#include "core/cuda/adamw.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cuda/check_args.h"

namespace loom::core::cuda {
namespace {

absl::Status Step(const char* op, Tensor* param, const Tensor& grad, Tensor* m, Tensor* v,
                  int64_t step, const cpu::AdamWOptions& opts, Tensor* param_bf16) {
  LOOM_RETURN_IF_ERROR(internal::CheckIs(op, "param", param, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(op, "grad", grad, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(op, "m", m, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(op, "v", v, DType::kF32));
  const int64_t n = param->numel();
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(op, "grad", grad, n, "same as param"));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(op, "m", *m, n, "same as param"));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(op, "v", *v, n, "same as param"));
  if (param_bf16 != nullptr) {
    LOOM_RETURN_IF_ERROR(internal::CheckIs(op, "param_bf16", param_bf16, DType::kBF16));
    LOOM_RETURN_IF_ERROR(ops::CheckNumel(op, "param_bf16", *param_bf16, n, "same as param"));
  }
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": step is ", step, ", expected >= 1 (the first step is 1)"));
  }
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      op, {{"param", param}, {"grad", &grad}, {"m", m}, {"v", v}, {"param_bf16", param_bf16}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  // The scalars exactly as core/cpu/adamw.cc computes them.
  const double t = static_cast<double>(step);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(opts.beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(opts.beta2), t));
  kernels::AdamWScalars s;
  s.beta1 = opts.beta1;
  s.beta2 = opts.beta2;
  s.eps = opts.eps;
  s.grad_scale = opts.grad_scale;
  s.step_size = opts.lr / bc1;
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(bc2)));
  s.decay = opts.lr * opts.weight_decay;
  LOOM_CUDA_LAUNCH(op, kernels::AdamW(param->data<float>(), grad.data<float>(), m->data<float>(),
                                      v->data<float>(),
                                      param_bf16 != nullptr ? param_bf16->raw_data() : nullptr, n,
                                      s, stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const cpu::AdamWOptions& opts) {
  return Step("AdamWStep", param, grad, m, v, step, opts, nullptr);
}

absl::Status AdamWStep(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v, int64_t step,
                       const cpu::AdamWOptions& opts, Tensor* param_bf16) {
  if (param_bf16 == nullptr) {
    return absl::InvalidArgumentError(
        "AdamWStep: output param_bf16 is null (use the overload without it)");
  }
  return Step("AdamWStep", param, grad, m, v, step, opts, param_bf16);
}

absl::Status AdamWStepWithCopy(Tensor* param, const Tensor& grad, Tensor* m, Tensor* v,
                               int64_t step, const cpu::AdamWOptions& opts, Tensor* param_copy) {
  constexpr const char* kOp = "AdamWStepWithCopy";
  // The contract's checks first, in the CPU's order (core/cpu/adamw.cc).
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "param", param, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckParamCopy(kOp, *param, param_copy));
  return Step(kOp, param, grad, m, v, step, opts, param_copy);
}

}  // namespace loom::core::cuda
