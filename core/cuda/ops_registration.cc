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
#include "core/cuda/flash_block.h"
#include "core/cuda/layernorm.h"
#include "core/cuda/linear.h"
#include "core/cuda/matmul.h"
#include "core/cuda/moe.h"
#include "core/cuda/qkv_split.h"
#include "core/cuda/reduce.h"
#include "core/cuda/residual_norm.h"
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
    // Qualified names: the option structs' namespace must not let ADL find
    // another device's kernel of the same name.
#define LOOM_REGISTER(Name, member, ...) t->member = &cuda::Name;
    LOOM_KERNEL_OPS(LOOM_REGISTER)
#undef LOOM_REGISTER
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
