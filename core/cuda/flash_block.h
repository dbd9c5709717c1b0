#ifndef LOOM_CORE_CUDA_FLASH_BLOCK_H_
#define LOOM_CORE_CUDA_FLASH_BLOCK_H_

// GPU twins of core/cpu/flash_block.h (the context-parallel ring's flash
// blocks), on the flash kernels of flash_attention.cu with position offsets:
// the same contract, causal mask and dropout mask at global positions. qkv,
// kv, out, dout f32 or bf16 (one dtype); the running state, lse, delta and
// the gradient accumulators dqkv, dkv always f32. Asynchronous on the
// current stream; deterministic (no atomics). Head dim <= 256, b * heads <= 65535.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cuda {

absl::Status FlashBlockInit(Tensor* acc, Tensor* max, Tensor* sum);
absl::Status FlashBlockForward(const Tensor& qkv, const Tensor& kv,
                               const ops::FlashBlockOptions& o, Tensor* acc, Tensor* max,
                               Tensor* sum);
absl::Status FlashBlockFinish(const Tensor& acc, const Tensor& max, const Tensor& sum,
                              Tensor* out, Tensor* lse);
absl::Status FlashBlockDelta(const Tensor& dout, const Tensor& out, int64_t heads, Tensor* delta);
absl::Status FlashBlockBackward(const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                const Tensor& lse, const Tensor& delta,
                                const ops::FlashBlockOptions& o, Tensor* dqkv, Tensor* dkv);
absl::Status FlashKvPack(const Tensor& qkv, int64_t heads, Tensor* kv);
absl::Status FlashKvUnpack(const Tensor& dkv, int64_t heads, Tensor* dqkv);

}  // namespace loom::core::cuda

#endif  // LOOM_CORE_CUDA_FLASH_BLOCK_H_
