#include "layers/layer_norm.h"

#include "core/ops/ops.h"
#include "core/status_macros.h"

namespace loom::layers {

using core::Tensor;

absl::StatusOr<Tensor> LayerNorm::Forward(const Tensor& x, Saved* saved) const {
  const int64_t rows = x.numel() / x.dim(x.rank() - 1);
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.shape(), x.dtype(), x.device()));
  LOOM_ASSIGN_OR_RETURN(saved->rstd, Tensor::Empty(core::Shape{rows}, core::DType::kF32, x.device()));
  saved->input = x;
  if (rms()) {
    LOOM_RETURN_IF_ERROR(core::ops::RmsNormForward(x, gamma_->value, eps_, &out, &saved->rstd));
    return out;
  }
  LOOM_ASSIGN_OR_RETURN(saved->mean, Tensor::Empty(core::Shape{rows}, core::DType::kF32, x.device()));
  LOOM_RETURN_IF_ERROR(core::ops::LayerNormForward(x, gamma_->value, beta_->value, eps_, &out,
                                                   &saved->mean, &saved->rstd));
  return out;
}

absl::StatusOr<Tensor> LayerNorm::Backward(const Tensor& dy, const Saved& saved) const {
  LOOM_ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(dy.shape(), dy.dtype(), dy.device()));
  if (rms()) {
    LOOM_RETURN_IF_ERROR(core::ops::RmsNormBackward(dy, saved.input, gamma_->value, saved.rstd,
                                                    &dx, &gamma_->grad));
    return dx;
  }
  LOOM_RETURN_IF_ERROR(core::ops::LayerNormBackward(dy, saved.input, gamma_->value, saved.mean,
                                                    saved.rstd, &dx, &gamma_->grad,
                                                    &beta_->grad));
  return dx;
}

}  // namespace loom::layers
