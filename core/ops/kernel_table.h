#ifndef LOOM_CORE_OPS_KERNEL_TABLE_H_
#define LOOM_CORE_OPS_KERNEL_TABLE_H_

// One device's implementations of the kernels core/ops dispatches to. The
// CPU table is built in; a device library (//core/cuda:ops) registers its
// table when linked, so //layers and //train run on a device without
// depending on its toolkit at build time. The member types are those of the
// CPU kernels, so a device whose signatures drift does not compile.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cpu/adamw.h"
#include "core/cpu/attention.h"
#include "core/cpu/convert.h"
#include "core/cpu/cross_entropy.h"
#include "core/cpu/dropout.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/embedding.h"
#include "core/cpu/flash_attention.h"
#include "core/cpu/layernorm.h"
#include "core/cpu/matmul.h"
#include "core/cpu/reduce.h"
#include "core/cpu/rmsnorm.h"
#include "core/cpu/rope.h"
#include "core/cpu/softmax.h"
#include "core/cpu/swiglu.h"
#include "core/cpu/vocab_parallel_ce.h"
#include "core/device.h"
#include "core/tensor.h"

namespace loom::core::ops {

struct KernelTable {
  const char* name = "";  // "cpu", "cuda"
  // Zero-fills one of this device's tensors. (Copies go through the
  // device's Allocator::CopyBytes: Tensor::To, ops::Copy.)
  absl::Status (*zero)(Tensor* t) = nullptr;
  // Blocks the host until the device has finished the work queued so far.
  absl::Status (*synchronize)() = nullptr;

  decltype(&cpu::Matmul) matmul = nullptr;
  decltype(&cpu::BatchedMatmul) batched_matmul = nullptr;
  decltype(&cpu::BiasAddForward) bias_add_forward = nullptr;
  decltype(&cpu::BiasAddBackward) bias_add_backward = nullptr;
  decltype(&cpu::GeluForward) gelu_forward = nullptr;
  decltype(&cpu::GeluBackward) gelu_backward = nullptr;
  decltype(&cpu::Add) add = nullptr;
  decltype(&cpu::Scale) scale = nullptr;
  decltype(&cpu::LayerNormForward) layernorm_forward = nullptr;
  decltype(&cpu::LayerNormBackward) layernorm_backward = nullptr;
  decltype(&cpu::RmsNormForward) rmsnorm_forward = nullptr;
  decltype(&cpu::RmsNormBackward) rmsnorm_backward = nullptr;
  decltype(&cpu::RopeForward) rope_forward = nullptr;
  decltype(&cpu::RopeBackward) rope_backward = nullptr;
  decltype(&cpu::SwigluForward) swiglu_forward = nullptr;
  decltype(&cpu::SwigluBackward) swiglu_backward = nullptr;
  decltype(&cpu::SoftmaxForward) softmax_forward = nullptr;
  decltype(&cpu::SoftmaxBackward) softmax_backward = nullptr;
  decltype(&cpu::DropoutForward) dropout_forward = nullptr;
  decltype(&cpu::DropoutBackward) dropout_backward = nullptr;
  decltype(&cpu::AttentionForward) attention_forward = nullptr;
  decltype(&cpu::AttentionBackward) attention_backward = nullptr;
  decltype(&cpu::FlashAttentionForward) flash_attention_forward = nullptr;
  decltype(&cpu::FlashAttentionBackward) flash_attention_backward = nullptr;
  decltype(&cpu::CrossEntropyForward) cross_entropy_forward = nullptr;
  decltype(&cpu::CrossEntropyBackward) cross_entropy_backward = nullptr;
  decltype(&cpu::VocabShardRowMax) vocab_shard_row_max = nullptr;
  decltype(&cpu::VocabShardSumExp) vocab_shard_sum_exp = nullptr;
  decltype(&cpu::VocabShardCrossEntropyBackward) vocab_shard_cross_entropy_backward = nullptr;
  decltype(&cpu::EmbeddingForward) embedding_forward = nullptr;
  decltype(&cpu::EmbeddingBackward) embedding_backward = nullptr;
  decltype(&cpu::Convert) convert = nullptr;
  decltype(&cpu::Sum) sum = nullptr;
  decltype(&cpu::SumSquares) sum_squares = nullptr;
  decltype(&cpu::AdamWStep) adamw_step = nullptr;
};

// Installs `table` for `type` (kept, not copied; must outlive the process).
// Returns the previous one. Called at start-up by device libraries; for the
// CPU only by wrappers of the built-in table (kernel_timer.h), and nullptr
// restores the built-in one.
const KernelTable* RegisterKernelTable(DeviceType type, const KernelTable* table);

// The CPU kernels built into core/ops.
const KernelTable* BuiltInCpuKernels();

// The table for `device`; FailedPrecondition naming the device and the
// library to link when none is registered.
absl::StatusOr<const KernelTable*> KernelsFor(Device device);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_KERNEL_TABLE_H_
