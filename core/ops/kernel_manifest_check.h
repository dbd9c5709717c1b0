#ifndef LOOM_CORE_OPS_KERNEL_MANIFEST_CHECK_H_
#define LOOM_CORE_OPS_KERNEL_MANIFEST_CHECK_H_

// Checks the kernel manifest (kernel_manifest.textproto) against the
// sources: what makes "a device default needs a device proof" a rule a CPU
// test enforces rather than a convention.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/kernel_manifest.pb.h"

namespace loom::core::ops {

// SHA-256 (hex) over the implementation's sources, each as its path, a NUL,
// its bytes, a NUL; paths relative to `root` (the repository).
absl::StatusOr<std::string> SourcesSha256(const Implementation& impl, const std::string& root);

// Every choice names a listed reference and, if any, a listed proven
// default; every listed source exists; no two choices share (op, device).
// A proven default on a device other than the CPU carries a whole proof
// (card, commit, date, benchmarks, correctness, speed) and the hash of its
// sources as they are now: an error names the op, the device and the
// implementation, and says to prove it again or to drop it as the default.
absl::Status CheckManifest(const KernelManifest& manifest, const std::string& root);

}  // namespace loom::core::ops

#endif  // LOOM_CORE_OPS_KERNEL_MANIFEST_CHECK_H_
