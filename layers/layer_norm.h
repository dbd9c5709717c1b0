#ifndef LOOM_LAYERS_LAYER_NORM_H_
#define LOOM_LAYERS_LAYER_NORM_H_

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "layers/params.h"

namespace loom::layers {

// LayerNorm (gamma, beta) or RMSNorm (gamma only, --normalization=RMSNorm)
// over the hidden dimension. Its parameters are replicated over TP; under
// sequence parallelism each rank normalises only its s/p rows, so the
// gradients are partial and get all-reduced over TP before the optimizer
// (ParamSpec::sequence_parallel_grad).
class LayerNorm {
 public:
  struct Saved {
    core::Tensor input, mean, rstd;  // [s(/p), b, h], [s(/p)·b] x2 (no mean for RMSNorm)
  };
  // LayerNorm.
  LayerNorm(Param* gamma, Param* beta, float eps) : gamma_(gamma), beta_(beta), eps_(eps) {}
  // RMSNorm: x · rsqrt(mean(x²) + eps) · gamma.
  static LayerNorm Rms(Param* gamma, float eps) { return LayerNorm(gamma, nullptr, eps); }

  absl::StatusOr<core::Tensor> Forward(const core::Tensor& x, Saved* saved) const;
  absl::StatusOr<core::Tensor> Backward(const core::Tensor& dy, const Saved& saved) const;
  bool rms() const { return beta_ == nullptr; }

 private:
  Param* gamma_;
  Param* beta_;  // null: RMSNorm
  float eps_;
};

}  // namespace loom::layers

#endif  // LOOM_LAYERS_LAYER_NORM_H_
