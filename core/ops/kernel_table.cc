#include "core/ops/kernel_table.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "core/cpu/adamw.h"
#include "core/cpu/attention.h"
#include "core/cpu/convert.h"
#include "core/cpu/cross_entropy.h"
#include "core/cpu/dropout.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/embedding.h"
#include "core/cpu/flash_attention.h"
#include "core/cpu/flash_block.h"
#include "core/cpu/layernorm.h"
#include "core/cpu/linear.h"
#include "core/cpu/matmul.h"
#include "core/cpu/moe.h"
#include "core/cpu/qkv_split.h"
#include "core/cpu/reduce.h"
#include "core/cpu/residual_norm.h"
#include "core/cpu/rmsnorm.h"
#include "core/cpu/rope.h"
#include "core/cpu/softmax.h"
#include "core/cpu/swiglu.h"
#include "core/cpu/vocab_parallel_ce.h"

namespace loom::core::ops {
namespace {

absl::Status CpuSynchronize() { return absl::OkStatus(); }

const KernelTable* CpuTable() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable;
    t->name = "cpu";
    t->zero = &cpu::Zero;
    t->synchronize = &CpuSynchronize;
#define LOOM_REGISTER(Name, member, ...) t->member = &cpu::Name;
    LOOM_KERNEL_OPS(LOOM_REGISTER)
#undef LOOM_REGISTER
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
