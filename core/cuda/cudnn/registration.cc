// Registers cuDNN's fused attention with //core/ops as the "cudnn" attention
// variant for CUDA tensors (core/ops/attention_plan.h). Whether it runs is
// the kernel manifest's decision (core/ops/kernel_manifest.textproto); a call
// it cannot run (f32, attention dropout, packed documents, a head dim cuDNN
// lacks, no libcudnn.so.9 on the machine) runs the reference instead, said once.

#include "core/cuda/cudnn/attention.h"
#include "core/ops/attention_plan.h"
#include "core/ops/contracts/attention_checks.h"
#include "core/status_macros.h"

namespace loom::core::cuda::cudnn {
namespace {

absl::Status SupportsCall(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout) {
  ops::AttentionDims g;
  LOOM_RETURN_IF_ERROR(ops::CheckQkv("cudnn attention", qkv, heads, &g));
  const AttentionShape shape{g.b, g.s, g.heads, g.heads, g.d};
  LOOM_RETURN_IF_ERROR(Supports(shape, qkv.dtype(), dropout.p));
  LOOM_RETURN_IF_ERROR(SupportsDocuments(dropout));
  return LoadedCudnnVersion().status();  // FailedPrecondition naming libcudnn.so.9
}

const ops::AttentionVariant kCudnnAttention = {
    "cudnn",
    &SupportsCall,
    &FlashAttentionForward,
    &FlashAttentionBackward,
};

[[maybe_unused]] const bool kRegistered = [] {
  ops::RegisterAttentionVariant(DeviceType::kCUDA, &kCudnnAttention);
  return true;
}();

}  // namespace
}  // namespace loom::core::cuda::cudnn
