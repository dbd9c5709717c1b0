// //core/cuda:attention_bench — the s x s CUDA attention (cuBLAS GEMMs around
// row kernels, attention.h) against the CUDA flash kernel, forward + backward
// with dropout, in the same run (not a test). Medians of CUDA-event intervals
// after warm-up. Without a GPU: prints why and exits with status 2.
//   bazel run //core/cuda:attention_bench [-- bf16|f32]

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/attention.h"
#include "core/cuda/copy.h"
#include "core/cuda/event.h"
#include "core/cuda/runtime.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace loom::core::cuda {
namespace {

absl::StatusOr<double> TimeMs(const std::function<absl::Status()>& fn, int iters = 5) {
  for (int i = 0; i < 2; ++i) LOOM_RETURN_IF_ERROR(fn());
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    LOOM_ASSIGN_OR_RETURN(Event a, Event::Create(true));
    LOOM_ASSIGN_OR_RETURN(Event b, Event::Create(true));
    LOOM_RETURN_IF_ERROR(a.Record());
    LOOM_RETURN_IF_ERROR(fn());
    LOOM_RETURN_IF_ERROR(b.Record());
    LOOM_RETURN_IF_ERROR(SynchronizeCurrentStream());
    LOOM_ASSIGN_OR_RETURN(float t, b.ElapsedMsSince(a));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

absl::StatusOr<Tensor> Filled(const Shape& shape, DType dtype, unsigned char byte) {
  LOOM_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, dtype, Device::CUDA(CurrentDevice())));
  LOOM_RETURN_IF_ERROR(FillBytes(&t, byte));
  return t;
}

absl::Status Run(DType dt) {
  const int64_t b = 4, heads = 16, d = 64;
  cpu::AttentionDropout dropout;
  dropout.p = 0.1f;
  dropout.seed = 1;
  std::printf("causal attention fwd+bwd, b=%lld heads=%lld d=%lld %s, dropout 0.1 (median ms)\n"
              "| s | s x s kernel | flash | s x s / flash | s x s buffers (probs + dS + dropped) |\n"
              "|---|---|---|---|---|\n",
              (long long)b, (long long)heads, (long long)d, DTypeName(dt));
  for (int64_t s : {1024, 2048, 4096, 8192}) {
    LOOM_ASSIGN_OR_RETURN(Tensor qkv, Filled(Shape{s, b, heads * 3 * d}, dt, 0x3c));
    LOOM_ASSIGN_OR_RETURN(Tensor dout, Filled(Shape{s, b, heads * d}, dt, 0x3c));
    LOOM_ASSIGN_OR_RETURN(Tensor out, Filled(Shape{s, b, heads * d}, dt, 0));
    LOOM_ASSIGN_OR_RETURN(Tensor dqkv, Filled(Shape{s, b, heads * 3 * d}, dt, 0));
    LOOM_ASSIGN_OR_RETURN(Tensor lse, Filled(Shape{b, heads, s}, DType::kF32, 0));
    const double ss_bytes = 3.0 * b * heads * s * s * DTypeSize(dt);
    double old_ms = -1;
    {
      LOOM_ASSIGN_OR_RETURN(Tensor probs, Filled(Shape{b, heads, s, s}, dt, 0));
      auto old = [&]() -> absl::Status {
        LOOM_RETURN_IF_ERROR(cuda::AttentionForward(qkv, heads, &out, &probs, dropout));
        return cuda::AttentionBackward(dout, qkv, probs, heads, &dqkv, dropout);
      };
      LOOM_ASSIGN_OR_RETURN(old_ms, TimeMs(old));
    }
    auto flash = [&]() -> absl::Status {
      LOOM_RETURN_IF_ERROR(cuda::FlashAttentionForward(qkv, heads, &out, &lse, dropout));
      return cuda::FlashAttentionBackward(dout, qkv, out, lse, heads, &dqkv, dropout);
    };
    LOOM_ASSIGN_OR_RETURN(double flash_ms, TimeMs(flash));
    std::printf("| %lld | %.2f | %.2f | %.2fx | %.2f GiB |\n", (long long)s, old_ms, flash_ms,
                old_ms / flash_ms, ss_bytes / (1ull << 30));
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace loom::core::cuda

int main(int argc, char** argv) {
  using namespace loom::core::cuda;  // NOLINT
  if (absl::StatusOr<int> n = VisibleDeviceCount(); !n.ok()) {
    std::fprintf(stderr, "attention_bench: no usable CUDA GPU: %s\n", n.status().ToString().c_str());
    return 2;
  }
  if (absl::Status s = SetCurrentDevice(0); !s.ok()) return 2;
  const loom::core::DType dt = argc > 1 && std::strcmp(argv[1], "f32") == 0
                                   ? loom::core::DType::kF32
                                   : loom::core::DType::kBF16;
  if (absl::Status s = Run(dt); !s.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
