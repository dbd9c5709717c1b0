// Fused AdamW step over f32 params and moments (formula of core/cpu/adamw.cc),
// optionally also writing the bf16 copy of the new params.

#include "core/cuda/device_util.cuh"

namespace loom::core::cuda::kernels {
namespace {

template <bool kBf16Copy>
__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v,
                            __nv_bfloat16* param_bf16, int64_t n, AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = param[i];
    const float np = p - s.step_size * mi / (sqrtf(vi) * s.inv_sqrt_bc2 + s.eps) - s.decay * p;
    param[i] = np;
    if (kBf16Copy) param_bf16[i] = __float2bfloat16_rn(np);
  }
}

}  // namespace

cudaError_t AdamW(float* param, const float* grad, float* m, float* v, void* param_bf16, int64_t n,
                  const AdamWScalars& s, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (param_bf16 != nullptr) {
    AdamWKernel<true><<<FlatBlocks(n), 256, 0, stream>>>(
        param, grad, m, v, static_cast<__nv_bfloat16*>(param_bf16), n, s);
  } else {
    AdamWKernel<false><<<FlatBlocks(n), 256, 0, stream>>>(param, grad, m, v, nullptr, n, s);
  }
  return cudaGetLastError();
}

}  // namespace loom::core::cuda::kernels
