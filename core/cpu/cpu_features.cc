#include "core/cpu/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::core::cpu {
namespace {

std::atomic<bool> g_hide_bf16{false};

uint64_t Xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;          // SSE, AVX, opmask, ZMM state
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx512f = os_avx512 && ((b >> 16) & 1);
    const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    f.amx_bf16 = os_amx && amx_bf16 && amx_tile;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
  }
  // Brand string: leaves 0x80000002..4.
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    f.model = brand;
    const size_t first = f.model.find_first_not_of(' ');
    f.model = first == std::string::npos ? "" : f.model.substr(first);
    while (!f.model.empty() && f.model.back() == ' ') f.model.pop_back();
  }
  if (f.model.empty()) f.model = "unknown model";
  // The kernels' AVX2-baseline switch (vec_math.h) hides every AVX-512
  // extension, so the "_avx2_test" variants see an AVX2-only machine.
  const char* off = std::getenv("LOOM_CPU_NO_AVX512");
  if (off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0) {
    f.avx512f = f.avx512_bf16 = f.amx_bf16 = false;
  }
  return f;
}

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

absl::Status CheckBf16GemmSupport(const char* what) {
  const CpuFeatures& f = HostCpuFeatures();
  if (!g_hide_bf16.load(std::memory_order_relaxed) && (f.avx512_bf16 || f.amx_bf16)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, " needs AVX512_BF16 or AMX-BF16 (bf16 GEMMs through oneDNN); this CPU (", f.model,
      ") has neither", f.avx512f ? " (it has AVX-512F without the BF16 extension)" : "",
      ". Drop --bf16 to train in f32 here, or run on a CPU that has them (Intel Cooper Lake or "
      "Sapphire Rapids and later, AMD Zen 4 and later)"));
}

void HideBf16ForTesting(bool hide) { g_hide_bf16.store(hide, std::memory_order_relaxed); }

}  // namespace loom::core::cpu
