// Registers the CUDA kernels as //core/ops's table for DeviceType::kCUDA at
// static initialisation: linking //core/cuda:ops is all a binary does to run
// layers and the trainer on a GPU.

#include "core/cuda/adamw.h"
#include "core/cuda/attention.h"
#include "core/cuda/convert.h"
#include "core/cuda/copy.h"
#include "core/cuda/cross_entropy.h"
#include "core/cuda/dropout.h"
#include "core/cuda/elementwise.h"
#include "core/cuda/embedding.h"
#include "core/cuda/layernorm.h"
#include "core/cuda/matmul.h"
#include "core/cuda/reduce.h"
#include "core/cuda/rmsnorm.h"
#include "core/cuda/rope.h"
#include "core/cuda/runtime.h"
#include "core/cuda/softmax.h"
#include "core/cuda/swiglu.h"
#include "core/cuda/vocab_parallel_ce.h"
#include "core/ops/kernel_table.h"

namespace loom::core::cuda {
namespace {

absl::Status Zero(Tensor* t) { return ZeroTensor(t); }
absl::Status Synchronize() { return SynchronizeCurrentStream(); }

const ops::KernelTable* CudaTable() {
  static const ops::KernelTable* table = [] {
    auto* t = new ops::KernelTable;
    t->name = "cuda";
    t->zero = &Zero;
    t->synchronize = &Synchronize;
    // Qualified names: the cpu:: option structs would make ADL find both.
    t->matmul = &cuda::Matmul;
    t->batched_matmul = &cuda::BatchedMatmul;
    t->bias_add_forward = &cuda::BiasAddForward;
    t->bias_add_backward = &cuda::BiasAddBackward;
    t->gelu_forward = &cuda::GeluForward;
    t->gelu_backward = &cuda::GeluBackward;
    t->add = &cuda::Add;
    t->scale = &cuda::Scale;
    t->layernorm_forward = &cuda::LayerNormForward;
    t->layernorm_backward = &cuda::LayerNormBackward;
    t->rmsnorm_forward = &cuda::RmsNormForward;
    t->rmsnorm_backward = &cuda::RmsNormBackward;
    t->rope_forward = &cuda::RopeForward;
    t->rope_backward = &cuda::RopeBackward;
    t->swiglu_forward = &cuda::SwigluForward;
    t->swiglu_backward = &cuda::SwigluBackward;
    t->softmax_forward = &cuda::SoftmaxForward;
    t->softmax_backward = &cuda::SoftmaxBackward;
    t->dropout_forward = &cuda::DropoutForward;
    t->dropout_backward = &cuda::DropoutBackward;
    t->attention_forward = &cuda::AttentionForward;
    t->attention_backward = &cuda::AttentionBackward;
    t->flash_attention_forward = &cuda::FlashAttentionForward;
    t->flash_attention_backward = &cuda::FlashAttentionBackward;
    t->cross_entropy_forward = &cuda::CrossEntropyForward;
    t->cross_entropy_backward = &cuda::CrossEntropyBackward;
    t->vocab_shard_row_max = &cuda::VocabShardRowMax;
    t->vocab_shard_sum_exp = &cuda::VocabShardSumExp;
    t->vocab_shard_cross_entropy_backward = &cuda::VocabShardCrossEntropyBackward;
    t->embedding_forward = &cuda::EmbeddingForward;
    t->embedding_backward = &cuda::EmbeddingBackward;
    t->convert = &cuda::Convert;
    t->sum = &cuda::Sum;
    t->sum_squares = &cuda::SumSquares;
    t->adamw_step = &cuda::AdamWStep;  // the overload without the bf16 copy
    return t;
  }();
  return table;
}

[[maybe_unused]] const bool kRegistered = [] {
  ops::RegisterKernelTable(DeviceType::kCUDA, CudaTable());
  return true;
}();

}  // namespace
}  // namespace loom::core::cuda
