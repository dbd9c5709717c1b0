#include "core/ops/ops.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace loom::core::ops {
namespace {

// Runs table member `fn` of the device `on` lives on.
// `args` is the parenthesised argument list.
#define LOOM_OPS_DISPATCH(on, fn, args)                                          \
  do {                                                                           \
    LOOM_ASSIGN_OR_RETURN(const KernelTable* table_, KernelsFor((on).device())); \
    if (table_->fn == nullptr) return NotInTable(*table_, #fn);                  \
    return table_->fn args;                                                      \
  } while (0)

// A registered table without the kernel (a device library older than core/ops).
absl::Status NotInTable(const KernelTable& table, const char* fn) {
  return absl::UnimplementedError(
      absl::StrCat("the ", table.name, " kernel table has no ", fn, " kernel"));
}

}  // namespace

absl::Status Copy(const Tensor& src, Tensor* dst) {
  if (dst == nullptr || !src.defined() || !dst->defined() || src.dtype() != dst->dtype() ||
      src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Copy: src ", src.defined() ? src.DebugString() : "undefined", " and dst ",
                     dst != nullptr && dst->defined() ? dst->DebugString() : "undefined",
                     ": expected two defined tensors of equal dtype and element count"));
  }
  // The non-CPU side's allocator moves the bytes (the CPU's for two host tensors).
  const Device on = src.device().is_cpu() ? dst->device() : src.device();
  Allocator* allocator = GetAllocator(on.type);
  if (allocator == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("Copy to ", dst->DebugString(), ": no allocator is registered for ",
                     on.ToString()));
  }
  return allocator->CopyBytes(dst->raw_data(), dst->device(), src.raw_data(), src.device(),
                              src.nbytes());
}

absl::Status Zero(Tensor* t) {
  if (t == nullptr || !t->defined()) return absl::InvalidArgumentError("Zero: undefined tensor");
  LOOM_OPS_DISPATCH(*t, zero, (t));
}

absl::Status Synchronize(Device device) {
  LOOM_ASSIGN_OR_RETURN(const KernelTable* table, KernelsFor(device));
  return table->synchronize();
}

#define LOOM_DEFINE_OP(Name, member, Ret, on, params, args) \
  Ret Name params { LOOM_OPS_DISPATCH(on, member, args); }
LOOM_KERNEL_OPS(LOOM_DEFINE_OP)
#undef LOOM_DEFINE_OP

#undef LOOM_OPS_DISPATCH

}  // namespace loom::core::ops
