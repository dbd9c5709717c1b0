#ifndef LOOM_CORE_CPU_CPU_FEATURES_H_
#define LOOM_CORE_CPU_CPU_FEATURES_H_

// What the host CPU can do, read once with cpuid/xgetbv at run time (every
// binary is built for AVX2 machines and picks faster paths where they exist).

#include <string>

#include "absl/status/status.h"

namespace loom::core::cpu {

struct CpuFeatures {
  bool avx512f = false;      // and the OS saves the AVX-512 state (XCR0 bits 5-7)
  bool avx512_bf16 = false;  // VCVTNE2PS2BF16 / VDPBF16PS (Cooper Lake, Sapphire Rapids, Zen 4+)
  bool amx_bf16 = false;     // AMX-TILE + AMX-BF16, and the OS supports the tile state
  std::string model;         // the brand string, e.g. "Intel(R) Xeon(R) Platinum 8480+"
};

// The host's features (computed on first use; thread-safe). With
// LOOM_CPU_NO_AVX512 set (vec_math.h's switch to the AVX2 baseline) every
// AVX-512 and AMX feature reads false.
const CpuFeatures& HostCpuFeatures();

// OK when bf16 GEMMs can run on this CPU (AVX512_BF16 or AMX-BF16);
// otherwise FailedPrecondition naming the missing instruction sets and the
// CPU model. `what` starts the message (e.g. "--bf16 on --device=cpu").
absl::Status CheckBf16GemmSupport(const char* what);

// Tests only: make CheckBf16GemmSupport (and the bf16 GEMM path) act as if
// this CPU had neither AVX512_BF16 nor AMX-BF16 (true), or as it is (false).
void HideBf16ForTesting(bool hide);

}  // namespace loom::core::cpu

#endif  // LOOM_CORE_CPU_CPU_FEATURES_H_
