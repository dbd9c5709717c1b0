#ifndef LOOM_CORE_OPS_KERNEL_CHOICE_H_
#define LOOM_CORE_OPS_KERNEL_CHOICE_H_

// Which implementation of an op with several runs on a device, on evidence:
// core/ops/kernel_manifest.textproto (compiled into the binary) names, per op
// and device, the reference and the proven default (see that file for the
// rule). LOOM_REFERENCE_KERNELS=1 forces every reference;
// LOOM_KERNEL_IMPL=op=name[,op=name...] forces one implementation (A/B runs
// on a device). Each decision is logged once to stderr with its reason.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"

namespace loom::core::ops {

struct KernelChoice {
  std::string implementation;  // "sxs", "flash", "cudnn", ...
  std::string reason;          // "proven default (NVIDIA H100 ..., 2026-12-..)", "reference: ..."
};

// The implementation of `op` ("attention") to run on `device`.
// InvalidArgument naming the variable when LOOM_KERNEL_IMPL names an op or
// implementation the manifest does not list for that device.
absl::StatusOr<KernelChoice> ChooseKernel(absl::string_view op, DeviceType device);

// The implementations the manifest lists for `op` on `device`, reference first.
std::vector<std::string> KernelImplementations(absl::string_view op, DeviceType device);

// Checks LOOM_KERNEL_IMPL and LOOM_REFERENCE_KERNELS against the manifest,
// for every device: what a binary calls before any work starts.
absl::Status CheckKernelOverrides();

// Forgets the decisions taken so far (each is taken once per process), so a
// test can change the variables and decide again.
void ForgetKernelChoicesForTesting();

// The manifest's text, as compiled in.
absl::string_view KernelManifestText();

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_KERNEL_CHOICE_H_
