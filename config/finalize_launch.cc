#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/backend_registry.h"
#include "config/finalize.h"
#include "core/cpu/cpu_features.h"
#include "core/ops/kernel_choice.h"
#include "core/status_macros.h"

namespace loom::train::finalize {

absl::Status Launch(TrainConfig* c, int world_size) {
  // LOOM_KERNEL_IMPL / LOOM_REFERENCE_KERNELS against the kernel manifest.
  LOOM_RETURN_IF_ERROR(core::ops::CheckKernelOverrides());
  const std::string backend = BackendOf(*c);
  // Any backend Loom knows (the registry's, built here or not: //plan sizes
  // NCCL jobs on CPU-only machines); whether it was built is CheckCommFlags'.
  absl::StatusOr<const comm::BackendInfo*> info =
      comm::LookupBackend(backend, c->distributed_backend_flag);
  if (!info.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(c->distributed_backend_flag, "=", backend,
                                                   ": expected one of ",
                                                   absl::StrJoin(comm::KnownBackends(), ", ")));
  }
  c->distributed_backend = backend;
  if (!(c->distributed_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--distributed-timeout-minutes (or --comm-timeout-s) must be > 0 (got ",
        c->distributed_timeout_s, " s)"));
  }
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size (", world_size, ") must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status Device(TrainConfig* c) {
  // Launch checked the name: the registry knows it.
  const std::string& backend = c->distributed_backend;
  const comm::BackendInfo* info = comm::FindBackend(backend);
  if (info->device == comm::BackendDevice::kCuda && c->device != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        c->distributed_backend_flag, "=", backend, " needs --device=cuda (it moves GPU memory; "
        "with --device=", core::EnumName(c->device), " use ",
        absl::StrJoin(comm::BackendsOn(comm::BackendDevice::kHost), ", "), ")"));
  }
  if (c->bf16 && c->device == DeviceKind::kCpu) {
    // The CPU's --bf16 runs the GEMMs on AVX512_BF16 or AMX-BF16 (checked
    // here, before any work starts, by cpuid).
    const absl::Status bf16 = core::cpu::CheckBf16GemmSupport("--bf16 on --device=cpu");
    if (!bf16.ok()) return bf16;
  }
  c->model.device = c->device == DeviceKind::kCuda ? core::Device::CUDA(0) : core::Device::CPU();
  c->model.compute_dtype = c->bf16 ? core::DType::kBF16 : core::DType::kF32;
  return absl::OkStatus();
}

}  // namespace loom::train::finalize
