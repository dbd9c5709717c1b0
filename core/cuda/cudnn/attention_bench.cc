// cuDNN SDPA speed (not a test): forward and backward, causal, bf16, at s 2048
// and 8192, d 64 and 128, MHA (16 heads) and GQA (32 heads, 8 groups), b such
// that b * s = 16384 tokens. Timed with CUDA events on Loom's stream over
// random data (never zeros). bazel run //core/cuda/cudnn:attention_bench
// Exits 2 with the reason on a machine without a GPU or without libcudnn.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/cuda/cudnn/attention.h"
#include "core/cuda/event.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace loom::core::cuda::cudnn {
namespace {

constexpr int kWarmup = 3;
constexpr int kIters = 10;

// Uniform [-1, 1) as bf16 (round to nearest even), uploaded.
absl::StatusOr<Tensor> RandomBf16(const Shape& shape, uint64_t seed) {
  absl::StatusOr<Tensor> host = Tensor::Empty(shape, DType::kBF16);
  if (!host.ok()) return host.status();
  uint16_t* p = static_cast<uint16_t*>(host->raw_data());
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < host->numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const float f = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    p[i] = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
  return host->To(Device::CUDA(CurrentDevice()));
}

#define BENCH_CHECK(expr)                                                      \
  do {                                                                         \
    const absl::Status st_ = (expr);                                           \
    if (!st_.ok()) {                                                           \
      std::fprintf(stderr, "attention_bench: %s: %s\n", #expr, st_.ToString().c_str()); \
      return st_;                                                              \
    }                                                                          \
  } while (0)

template <typename F>
absl::StatusOr<double> TimeMs(F&& f) {
  for (int i = 0; i < kWarmup; ++i) BENCH_CHECK(f());
  absl::StatusOr<Event> start = Event::Create(true), stop = Event::Create(true);
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  BENCH_CHECK(start->Record());
  for (int i = 0; i < kIters; ++i) BENCH_CHECK(f());
  BENCH_CHECK(stop->Record());
  BENCH_CHECK(stop->Synchronize());
  absl::StatusOr<float> ms = stop->ElapsedMsSince(*start);
  if (!ms.ok()) return ms.status();
  return static_cast<double>(*ms) / kIters;
}

absl::Status One(int64_t s, int64_t d, int64_t heads, int64_t groups) {
  const int64_t b = 16384 / s;
  const bool gqa = groups != heads;
  absl::StatusOr<Tensor> out = Tensor::Empty({s, b, heads * d}, DType::kBF16, Device::CUDA(CurrentDevice()));
  absl::StatusOr<Tensor> lse = Tensor::Empty({b, heads, s}, DType::kF32, Device::CUDA(CurrentDevice()));
  absl::StatusOr<Tensor> dout = RandomBf16({s, b, heads * d}, 3);
  if (!out.ok() || !lse.ok() || !dout.ok()) return absl::ResourceExhaustedError("allocation");
  absl::StatusOr<double> fwd, bwd;
  if (!gqa) {
    absl::StatusOr<Tensor> qkv = RandomBf16({s, b, heads * 3 * d}, 1);
    absl::StatusOr<Tensor> dqkv = Tensor::Empty({s, b, heads * 3 * d}, DType::kBF16, Device::CUDA(CurrentDevice()));
    if (!qkv.ok() || !dqkv.ok()) return absl::ResourceExhaustedError("allocation");
    fwd = TimeMs([&] { return FlashAttentionForward(*qkv, heads, &*out, &*lse); });
    bwd = TimeMs([&] { return FlashAttentionBackward(*dout, *qkv, *out, *lse, heads, &*dqkv); });
  } else {
    absl::StatusOr<Tensor> q = RandomBf16({s, b, heads * d}, 1), k = RandomBf16({s, b, groups * d}, 2);
    absl::StatusOr<Tensor> v = RandomBf16({s, b, groups * d}, 4);
    absl::StatusOr<Tensor> dq = Tensor::Empty({s, b, heads * d}, DType::kBF16, Device::CUDA(CurrentDevice()));
    absl::StatusOr<Tensor> dk = Tensor::Empty({s, b, groups * d}, DType::kBF16, Device::CUDA(CurrentDevice()));
    absl::StatusOr<Tensor> dv = Tensor::Empty({s, b, groups * d}, DType::kBF16, Device::CUDA(CurrentDevice()));
    if (!q.ok() || !k.ok() || !v.ok() || !dq.ok() || !dk.ok() || !dv.ok()) {
      return absl::ResourceExhaustedError("allocation");
    }
    fwd = TimeMs([&] { return GqaAttentionForward(*q, *k, *v, heads, groups, &*out, &*lse); });
    bwd = TimeMs([&] {
      return GqaAttentionBackward(*dout, *q, *k, *v, *out, *lse, heads, groups, &*dq, &*dk, &*dv);
    });
  }
  if (!fwd.ok()) return fwd.status();
  if (!bwd.ok()) return bwd.status();
  const double flops_fwd = 2.0 * 2.0 * b * heads * static_cast<double>(s) * s * d / 2.0;
  const double flops_bwd = 2.5 * flops_fwd;
  std::printf("%-4s s %5lld d %3lld h %2lld g %2lld b %2lld | fwd %8.3f ms %7.1f TFLOP/s | bwd %8.3f ms %7.1f TFLOP/s | fwd+bwd %7.1f TFLOP/s\n",
              gqa ? "GQA" : "MHA", static_cast<long long>(s), static_cast<long long>(d),
              static_cast<long long>(heads), static_cast<long long>(groups),
              static_cast<long long>(b), *fwd, flops_fwd / (*fwd * 1e9), *bwd,
              flops_bwd / (*bwd * 1e9), (flops_fwd + flops_bwd) / ((*fwd + *bwd) * 1e9));
  return absl::OkStatus();
}

int Main() {
  const absl::StatusOr<int> n = VisibleDeviceCount();
  if (!n.ok()) {
    std::fprintf(stderr, "attention_bench: needs a CUDA GPU: %s\n", n.status().ToString().c_str());
    return 2;
  }
  if (absl::Status st = SetCurrentDevice(0); !st.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", st.ToString().c_str());
    return 2;
  }
  const absl::StatusOr<int64_t> version = LoadedCudnnVersion();
  if (!version.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", version.status().ToString().c_str());
    return 2;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("cuDNN SDPA (cudnn-frontend graphs), libcudnn %lld, %s, bf16, causal, deterministic backward\n",
              static_cast<long long>(*version), prop.name);
  std::printf("FLOPs: forward = 2 * 2 * b * h * s^2 * d / 2 (two GEMMs, causal half); "
              "backward = 2.5 x forward; %d warm-up + %d timed iterations (CUDA events)\n",
              kWarmup, kIters);
  int failures = 0;
  for (int64_t s : {2048, 8192}) {
    for (int64_t d : {64, 128}) {
      if (!One(s, d, 16, 16).ok()) ++failures;
      if (!One(s, d, 32, 8).ok()) ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace loom::core::cuda::cudnn

int main() { return loom::core::cuda::cudnn::Main(); }
