#include "core/ops/kernel_table.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::core::ops {
namespace {

absl::Status CpuSynchronize() { return absl::OkStatus(); }

const KernelTable* CpuTable() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable;
    t->name = "cpu";
    t->zero = &cpu::Zero;
    t->synchronize = &CpuSynchronize;
    t->matmul = &cpu::Matmul;
    t->batched_matmul = &cpu::BatchedMatmul;
    t->bias_add_forward = &cpu::BiasAddForward;
    t->bias_add_backward = &cpu::BiasAddBackward;
    t->gelu_forward = &cpu::GeluForward;
    t->gelu_backward = &cpu::GeluBackward;
    t->add = &cpu::Add;
    t->scale = &cpu::Scale;
    t->layernorm_forward = &cpu::LayerNormForward;
    t->layernorm_backward = &cpu::LayerNormBackward;
    t->rmsnorm_forward = &cpu::RmsNormForward;
    t->rmsnorm_backward = &cpu::RmsNormBackward;
    t->rope_forward = &cpu::RopeForward;
    t->rope_backward = &cpu::RopeBackward;
    t->swiglu_forward = &cpu::SwigluForward;
    t->swiglu_backward = &cpu::SwigluBackward;
    t->softmax_forward = &cpu::SoftmaxForward;
    t->softmax_backward = &cpu::SoftmaxBackward;
    t->dropout_forward = &cpu::DropoutForward;
    t->dropout_backward = &cpu::DropoutBackward;
    t->attention_forward = &cpu::AttentionForward;
    t->attention_backward = &cpu::AttentionBackward;
    t->flash_attention_forward = &cpu::FlashAttentionForward;
    t->flash_attention_backward = &cpu::FlashAttentionBackward;
    t->cross_entropy_forward = &cpu::CrossEntropyForward;
    t->cross_entropy_backward = &cpu::CrossEntropyBackward;
    t->vocab_shard_row_max = &cpu::VocabShardRowMax;
    t->vocab_shard_sum_exp = &cpu::VocabShardSumExp;
    t->vocab_shard_cross_entropy_backward = &cpu::VocabShardCrossEntropyBackward;
    t->embedding_forward = &cpu::EmbeddingForward;
    t->embedding_backward = &cpu::EmbeddingBackward;
    t->convert = &cpu::Convert;
    t->sum = &cpu::Sum;
    t->sum_squares = &cpu::SumSquares;
    t->adamw_step = &cpu::AdamWStep;
    return t;
  }();
  return table;
}

std::atomic<const KernelTable*> g_cuda_table{nullptr};
// Replaced only by a wrapper of the built-in table (kernel_timer.h).
std::atomic<const KernelTable*> g_cpu_table{nullptr};

}  // namespace

const KernelTable* BuiltInCpuKernels() { return CpuTable(); }

const KernelTable* RegisterKernelTable(DeviceType type, const KernelTable* table) {
  if (type == DeviceType::kCPU) {
    const KernelTable* previous = g_cpu_table.exchange(table);
    return previous != nullptr ? previous : CpuTable();
  }
  return g_cuda_table.exchange(table);
}

absl::StatusOr<const KernelTable*> KernelsFor(Device device) {
  if (device.is_cpu()) {
    const KernelTable* table = g_cpu_table.load(std::memory_order_acquire);
    return table != nullptr ? table : CpuTable();
  }
  const KernelTable* table = g_cuda_table.load();
  if (table == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a tensor lives on ", device.ToString(),
        " but no CUDA kernels are linked into this binary (link //core/cuda:ops; it is built "
        "only where the CUDA toolkit was found)"));
  }
  return table;
}

}  // namespace loom::core::ops
