#ifndef LOOM_CORE_CUDA_LINEAR_H_
#define LOOM_CORE_CUDA_LINEAR_H_

// GPU twins of core/cpu/linear.h: a linear layer's GEMMs with cuBLASLt
// epilogues (blaslt.h), as llm.c and Transformer Engine run them:
//   LinearForward:        GEMM + bias (EPILOGUE_BIAS), or + bias + GELU
//                         keeping the pre-activation (EPILOGUE_GELU_AUX_BIAS);
//   LinearBackwardData:   dX GEMM with dGELU and the bias gradient before the
//                         GELU (EPILOGUE_DGELU_BGRAD);
//   LinearBackwardWeight: dW += dYᵀ·X with the bias gradient (EPILOGUE_BGRADB).
// x, w, dy, y, pre, dx of one dtype (f32 or bf16); dw and the accumulated
// dbias of that dtype or f32; f32 math. cuBLASLt writes bias gradients in
// the GEMM output's dtype: they go through a scratch vector (bf16 for a bf16
// dX) and are then added to dbias. Where cuBLASLt offers no algorithm (e.g.
// the GELU input's leading dim is not a multiple of 8) these run the unfused
// kernels (matmul.h, elementwise.h), said once on stderr.
// Not the CUDA default (core/ops/kernel_manifest.textproto, "linear_epilogue").

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cuda {

absl::Status LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor* y,
                           Tensor* pre, const ops::LinearOptions& opts);
absl::Status LinearBackwardData(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor* dx,
                                Tensor* dbias, const ops::LinearOptions& opts);
absl::Status LinearBackwardWeight(const Tensor& dy, const Tensor& x, Tensor* dw, Tensor* dbias,
                                  const ops::LinearOptions& opts);

// The unfused sequences (cuBLAS GEMM, bias, GELU kernels) with the same
// contract: the fallback above, and the A/B baseline of //core/cuda:bench.
absl::Status LinearForwardUnfused(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor* y,
                                  Tensor* pre, const ops::LinearOptions& opts);
absl::Status LinearBackwardDataUnfused(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                       Tensor* dx, Tensor* dbias, const ops::LinearOptions& opts);
absl::Status LinearBackwardWeightUnfused(const Tensor& dy, const Tensor& x, Tensor* dw,
                                         Tensor* dbias, const ops::LinearOptions& opts);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_LINEAR_H_
