// GPU kernel speed table (not a test):
//   bazel run //core/cuda:bench [-- --json --iters=N --warmup=N]
// bf16 GEMM through cuda::Matmul next to raw cublasGemmEx on the same shapes
// in the same run (4096^3 and GPT-2-medium's tokens=8192, h=1024 layer
// GEMMs), then causal attention forward and forward+backward at seq 2048
// (batch 4, 16 heads, head dim 64, bf16). Times are medians of CUDA-event
// intervals after warm-up. Without a GPU: prints why and exits with status 2.
//
// Attention FLOPs: the forward is 4 b h s^2 d (QKᵀ and PV, 2 s^2 d each),
// halved because a causal mask leaves half of the products useful; the
// backward is 2.5x the forward (dP, dQ, dK, dV and the recompute-free
// softmax), so forward+backward counts 3.5x. Our kernels compute the full
// s x s products, so these are "useful" TFLOP/s.

#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/attention.h"
#include "core/cuda/blas.h"
#include "core/cuda/copy.h"
#include "core/cuda/event.h"
#include "core/cuda/linear.h"
#include "core/cuda/matmul.h"
#include "core/cuda/runtime.h"
#include "core/ops/contracts/options.h"
#include "core/tensor.h"

namespace loom::core::cuda {
namespace {

struct Flags {
  bool json = false;
  int iters = 20;
  int warmup = 5;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      f->json = true;
    } else if (a.rfind("--iters=", 0) == 0) {
      f->iters = std::max(1, std::atoi(a.c_str() + 8));
    } else if (a.rfind("--warmup=", 0) == 0) {
      f->warmup = std::max(0, std::atoi(a.c_str() + 9));
    } else {
      std::fprintf(stderr, "bench: unknown flag %s (flags: --json --iters=N --warmup=N)\n",
                   a.c_str());
      return false;
    }
  }
  return true;
}

// Median milliseconds of fn over iters runs (each bracketed by events).
absl::StatusOr<double> TimeMs(const Flags& f, const std::function<absl::Status()>& fn) {
  for (int i = 0; i < f.warmup; ++i) {
    if (absl::Status s = fn(); !s.ok()) return s;
  }
  std::vector<Event> starts, stops;
  for (int i = 0; i < f.iters; ++i) {
    absl::StatusOr<Event> a = Event::Create(true), b = Event::Create(true);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    starts.push_back(*std::move(a));
    stops.push_back(*std::move(b));
  }
  for (int i = 0; i < f.iters; ++i) {
    if (absl::Status s = starts[i].Record(); !s.ok()) return s;
    if (absl::Status s = fn(); !s.ok()) return s;
    if (absl::Status s = stops[i].Record(); !s.ok()) return s;
  }
  if (absl::Status s = SynchronizeCurrentStream(); !s.ok()) return s;
  std::vector<double> ms;
  for (int i = 0; i < f.iters; ++i) {
    absl::StatusOr<float> t = stops[i].ElapsedMsSince(starts[i]);
    if (!t.ok()) return t.status();
    ms.push_back(*t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

absl::StatusOr<Tensor> Filled(const Shape& shape, DType dtype, unsigned char byte) {
  absl::StatusOr<Tensor> t = Tensor::Empty(shape, dtype, Device::CUDA(CurrentDevice()));
  if (!t.ok()) return t.status();
  if (absl::Status s = FillBytes(&*t, byte); !s.ok()) return s;
  return t;
}

// Uniform in [-scale, scale) on the host (a fixed LCG), as bf16 on the GPU:
// GEMMs run measurably faster on constant data, so the A/B rows use this.
absl::StatusOr<Tensor> RandomOnGpu(const Shape& shape, DType dtype, uint64_t seed, float scale) {
  absl::StatusOr<Tensor> host = Tensor::Empty(shape, dtype, Device::CPU());
  if (!host.ok()) return host.status();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < host->numel(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const float v = scale * (static_cast<float>(x >> 40) / 8388608.0f - 1.0f);
    if (dtype == DType::kBF16) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      static_cast<uint16_t*>(host->raw_data())[i] = static_cast<uint16_t>(bits >> 16);
    } else {
      host->data<float>()[i] = v;
    }
  }
  return host->To(Device::CUDA(CurrentDevice()));
}

struct Row {
  std::string name;
  double ms, tflops, ratio;  // ratio: to raw cuBLAS (GEMM) or to the GEMM rate (attention)
};

absl::Status Run(const Flags& f) {
  std::vector<Row> rows;
  struct Shape3 {
    const char* name;
    int64_t m, n, k;
  };
  const Shape3 shapes[] = {{"gemm 4096x4096x4096", 4096, 4096, 4096},
                           {"gemm [8192x1024]x[1024x3072]", 8192, 3072, 1024},
                           {"gemm [8192x1024]x[1024x4096]", 8192, 4096, 1024},
                           {"gemm [8192x4096]x[4096x1024]", 8192, 1024, 4096}};
  double gemm_rate = 0.0;  // our Matmul at 4096^3, the attention reference
  for (const Shape3& s : shapes) {
    // 0x3c bytes: every bf16 is 0x3c3c (~0.0115), finite and tame.
    absl::StatusOr<Tensor> a = Filled(Shape{s.m, s.k}, DType::kBF16, 0x3c);
    absl::StatusOr<Tensor> b = Filled(Shape{s.k, s.n}, DType::kBF16, 0x3c);
    absl::StatusOr<Tensor> c = Filled(Shape{s.m, s.n}, DType::kBF16, 0);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    if (!c.ok()) return c.status();
    const double flops = 2.0 * s.m * s.n * s.k;
    absl::StatusOr<double> ours = TimeMs(f, [&] { return Matmul(*a, *b, &*c); });
    if (!ours.ok()) return ours.status();
    absl::StatusOr<double> raw = TimeMs(f, [&]() -> absl::Status {
      absl::StatusOr<cublasHandle_t> h = internal::BlasHandle();
      if (!h.ok()) return h.status();
      const float alpha = 1.0f, beta = 0.0f;
      // Row-major C = A B as column-major Cᵀ = Bᵀ Aᵀ.
      const cublasStatus_t st = cublasGemmEx(
          *h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(s.n), static_cast<int>(s.m),
          static_cast<int>(s.k), &alpha, b->raw_data(), CUDA_R_16BF, static_cast<int>(s.n),
          a->raw_data(), CUDA_R_16BF, static_cast<int>(s.k), &beta, c->raw_data(), CUDA_R_16BF,
          static_cast<int>(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) {
        return absl::InternalError(absl::StrCat("cublasGemmEx: ", internal::CublasStatusName(st)));
      }
      return absl::OkStatus();
    });
    if (!raw.ok()) return raw.status();
    const double t_ours = flops / (*ours * 1e-3) / 1e12, t_raw = flops / (*raw * 1e-3) / 1e12;
    if (gemm_rate == 0.0) gemm_rate = t_ours;
    rows.push_back({absl::StrCat(s.name, " (Matmul)"), *ours, t_ours, t_ours / t_raw});
    rows.push_back({absl::StrCat(s.name, " (raw cublasGemmEx)"), *raw, t_raw, 1.0});
  }

  const int64_t seq = 2048, batch = 4, heads = 16, d = 64;
  absl::StatusOr<Tensor> qkv = Filled(Shape{seq, batch, heads * 3 * d}, DType::kBF16, 0x3c);
  absl::StatusOr<Tensor> out = Filled(Shape{seq, batch, heads * d}, DType::kBF16, 0);
  absl::StatusOr<Tensor> probs = Filled(Shape{batch, heads, seq, seq}, DType::kBF16, 0);
  absl::StatusOr<Tensor> dout = Filled(Shape{seq, batch, heads * d}, DType::kBF16, 0x3c);
  absl::StatusOr<Tensor> dqkv = Filled(Shape{seq, batch, heads * 3 * d}, DType::kBF16, 0);
  for (const auto* t : {&qkv, &out, &probs, &dout, &dqkv}) {
    if (!t->ok()) return t->status();
  }
  const double fwd_flops = 4.0 * batch * heads * seq * seq * d / 2.0;  // causal: half useful
  absl::StatusOr<double> fwd =
      TimeMs(f, [&] { return AttentionForward(*qkv, heads, &*out, &*probs); });
  if (!fwd.ok()) return fwd.status();
  absl::StatusOr<double> both = TimeMs(f, [&]() -> absl::Status {
    if (absl::Status s = AttentionForward(*qkv, heads, &*out, &*probs); !s.ok()) return s;
    return AttentionBackward(*dout, *qkv, *probs, heads, &*dqkv);
  });
  if (!both.ok()) return both.status();
  const double t_fwd = fwd_flops / (*fwd * 1e-3) / 1e12;
  const double t_both = 3.5 * fwd_flops / (*both * 1e-3) / 1e12;
  rows.push_back({"attention fwd s=2048 b=4 h=16 d=64 bf16 causal", *fwd, t_fwd,
                  t_fwd / gemm_rate});
  rows.push_back({"attention fwd+bwd s=2048 b=4 h=16 d=64 bf16 causal", *both, t_both,
                  t_both / gemm_rate});

  // The linear layers' GEMM epilogues (core/cuda/linear.h), GPT-2-medium's
  // MLP at 8192 tokens (h 1024, ffn 4096), bf16 activations, f32 gradients,
  // random data: the unfused sequence (cuBLAS GEMM + bias/GELU/dGELU/bias
  // gradient kernels) against one cuBLASLt GEMM with its epilogue, same run.
  // Fused rows' ratio: unfused ms / fused ms (> 1: the epilogue is faster).
  {
    const int64_t n = 8192, h = 1024, ffn = 4096;
    const DType bf = DType::kBF16, f32 = DType::kF32;
    absl::StatusOr<Tensor> x = RandomOnGpu(Shape{n, h}, bf, 11, 1.0f);
    absl::StatusOr<Tensor> w_up = RandomOnGpu(Shape{ffn, h}, bf, 12, 0.03f);
    absl::StatusOr<Tensor> b_up = RandomOnGpu(Shape{ffn}, bf, 13, 0.1f);
    absl::StatusOr<Tensor> act = RandomOnGpu(Shape{n, ffn}, bf, 14, 1.0f);
    absl::StatusOr<Tensor> pre = RandomOnGpu(Shape{n, ffn}, bf, 15, 2.0f);
    absl::StatusOr<Tensor> w_down = RandomOnGpu(Shape{h, ffn}, bf, 16, 0.015f);
    absl::StatusOr<Tensor> b_down = RandomOnGpu(Shape{h}, bf, 17, 0.1f);
    absl::StatusOr<Tensor> dy = RandomOnGpu(Shape{n, h}, bf, 18, 1.0f);
    absl::StatusOr<Tensor> dpre = RandomOnGpu(Shape{n, ffn}, bf, 19, 1.0f);
    absl::StatusOr<Tensor> y_up = RandomOnGpu(Shape{n, ffn}, bf, 20, 1.0f);
    absl::StatusOr<Tensor> y_down = RandomOnGpu(Shape{n, h}, bf, 21, 1.0f);
    absl::StatusOr<Tensor> dw_up = RandomOnGpu(Shape{ffn, h}, f32, 22, 0.0f);
    absl::StatusOr<Tensor> dw_down = RandomOnGpu(Shape{h, ffn}, f32, 23, 0.0f);
    absl::StatusOr<Tensor> db_up = RandomOnGpu(Shape{ffn}, f32, 24, 0.0f);
    absl::StatusOr<Tensor> db_down = RandomOnGpu(Shape{h}, f32, 25, 0.0f);
    for (const auto* t : {&x, &w_up, &b_up, &act, &pre, &w_down, &b_down, &dy, &dpre, &y_up,
                          &y_down, &dw_up, &dw_down, &db_up, &db_down}) {
      if (!t->ok()) return t->status();
    }
    const ops::LinearOptions gelu{true, false}, plain{false, false};
    const double up_flops = 2.0 * n * h * ffn;  // every GEMM here has n·h·ffn products
    struct Case {
      const char* name;
      std::function<absl::Status()> unfused, fused;
    };
    const Case cases[] = {
        {"linear fwd up+bias+gelu [8192x1024]x[1024x4096]",
         [&] { return LinearForwardUnfused(*x, *w_up, *b_up, &*y_up, &*pre, gelu); },
         [&] { return LinearForward(*x, *w_up, *b_up, &*y_up, &*pre, gelu); }},
        {"linear fwd down+bias [8192x4096]x[4096x1024]",
         [&] { return LinearForwardUnfused(*act, *w_down, *b_down, &*y_down, nullptr, plain); },
         [&] { return LinearForward(*act, *w_down, *b_down, &*y_down, nullptr, plain); }},
        {"linear bwd dX down+dgelu+dbias [8192x1024]x[1024x4096]",
         [&] { return LinearBackwardDataUnfused(*dy, *w_down, *pre, &*dpre, &*db_up, gelu); },
         [&] { return LinearBackwardData(*dy, *w_down, *pre, &*dpre, &*db_up, gelu); }},
        {"linear bwd dW up+dbias [4096x8192]x[8192x1024]",
         [&] { return LinearBackwardWeightUnfused(*dpre, *x, &*dw_up, &*db_up, plain); },
         [&] { return LinearBackwardWeight(*dpre, *x, &*dw_up, &*db_up, plain); }},
        {"linear bwd dW down+dbias [1024x8192]x[8192x4096]",
         [&] { return LinearBackwardWeightUnfused(*dy, *act, &*dw_down, &*db_down, plain); },
         [&] { return LinearBackwardWeight(*dy, *act, &*dw_down, &*db_down, plain); }},
    };
    for (const Case& c : cases) {
      absl::StatusOr<double> unfused = TimeMs(f, c.unfused);
      if (!unfused.ok()) return unfused.status();
      absl::StatusOr<double> fused = TimeMs(f, c.fused);
      if (!fused.ok()) return fused.status();
      rows.push_back({absl::StrCat(c.name, " unfused"), *unfused,
                      up_flops / (*unfused * 1e-3) / 1e12, 1.0});
      rows.push_back({absl::StrCat(c.name, " cublaslt"), *fused, up_flops / (*fused * 1e-3) / 1e12,
                      *unfused / *fused});
    }
  }

  if (f.json) {
    std::printf("{\"iters\": %d, \"warmup\": %d, \"rows\": [", f.iters, f.warmup);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::printf("%s{\"name\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f, \"ratio\": %.3f}",
                  i ? ", " : "", rows[i].name.c_str(), rows[i].ms, rows[i].tflops, rows[i].ratio);
    }
    std::printf("]}\n");
  } else {
    std::printf("%-66s %10s %9s %7s\n", "case", "median ms", "TFLOP/s", "ratio");
    for (const Row& r : rows) {
      std::printf("%-66s %10.4f %9.2f %7.3f\n", r.name.c_str(), r.ms, r.tflops, r.ratio);
    }
    std::printf("ratio: GEMM rows = Matmul / raw cublasGemmEx; attention rows = attention rate /"
                " our bf16 4096^3 GEMM rate.\nattention FLOPs count causal halving: fwd = 2 b h"
                " s^2 d, fwd+bwd = 3.5x fwd.\nlinear rows: cublaslt ratio = unfused ms / cublaslt ms"
                " (same run, random bf16 data).\n");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace loom::core::cuda

int main(int argc, char** argv) {
  using namespace loom::core::cuda;  // NOLINT
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 1;
  absl::StatusOr<int> n = VisibleDeviceCount();
  if (!n.ok()) {
    std::fprintf(stderr, "bench: no usable CUDA GPU, nothing to measure: %s\n",
                 n.status().ToString().c_str());
    return 2;
  }
  if (absl::Status s = SetCurrentDevice(0); !s.ok()) {
    std::fprintf(stderr, "bench: %s\n", s.ToString().c_str());
    return 2;
  }
  if (absl::Status s = Run(flags); !s.ok()) {
    std::fprintf(stderr, "bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
