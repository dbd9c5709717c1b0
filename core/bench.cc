// //core:bench — speed of the CPU kernels of a GPT-2-small layer.
//
//   bazel run //core:bench [-- --reps=7 --rounds=3 --json --gemm=false --filter=gelu]
//   bazel run //core:bench -- --tokens=256 --vocab=50257   (//train:bench's B4 T64 GEMMs)
//
// Part 1: GFLOP/s of the layer's GEMMs (forward Y = X·Wᵀ, and the backward
// dX = dY·W and dW = dYᵀ·X) for our path (core/cpu Matmul → oneDNN) and for
// each BLAS found at run time: oneDNN's dnnl_sgemm called directly, OpenBLAS
// and BLIS through dlopen(RTLD_LOCAL) + dlsym("cblas_sgemm") so their symbols
// never clash with the linked oneDNN. Ratio: ours / best library.
// Part 2: GB/s of the element-wise kernels (with Llama's RMSNorm, SwiGLU and
// RoPE at the same sizes), bytes read + written, against an
// all-thread memcpy moving the same number of bytes, sampled alternately with
// the kernel (ratio = median over --reps x --rounds pairs). Sizes are 3-88 MB,
// above L2. Never read speed from a test run.

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/cpu/adamw.h"
#include "core/cpu/attention.h"
#include "core/cpu/convert.h"
#include "core/cpu/cpu_features.h"
#include "core/cpu/cross_entropy.h"
#include "core/cpu/dropout.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/embedding.h"
#include "core/cpu/layernorm.h"
#include "core/cpu/matmul.h"
#include "core/cpu/rmsnorm.h"
#include "core/cpu/rope.h"
#include "core/cpu/softmax.h"
#include "core/cpu/swiglu.h"
#include "core/tensor.h"
#include "oneapi/dnnl/dnnl.h"

ABSL_FLAG(int, reps, 7, "samples per measurement (the median is reported)");
ABSL_FLAG(int, rounds, 3,
          "each measurement is repeated in this many rounds (50 ms apart) and the "
          "best round's median is reported: other processes on a shared machine slow whole "
          "stretches of seconds, which a median within one round cannot filter out");
ABSL_FLAG(bool, gemm, true, "run the GEMM table");
ABSL_FLAG(int64_t, tokens, 1024,
          "rows of the GEMM table's activations (micro-batch x sequence: 256 is //train:bench's "
          "B4 T64)");
ABSL_FLAG(int64_t, vocab, 0, "if > 0: also the output layer's GEMMs with this vocabulary");
ABSL_FLAG(bool, bf16_gemm, true,
          "run the bf16-vs-f32 GEMM table (where the CPU has AVX512_BF16 or AMX-BF16)");
ABSL_FLAG(bool, elementwise, true, "run the element-wise and attention tables");
ABSL_FLAG(std::string, filter, "", "only element-wise kernels whose name contains this");
ABSL_FLAG(bool, best, false,
          "element-wise: report the fastest sample of each instead of the median (an "
          "estimate of the undisturbed speed on a heavily loaded machine)");
ABSL_FLAG(bool, json, false, "also print the results as one JSON object on the last line");

namespace loom::core {
namespace {

using Clock = std::chrono::steady_clock;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

Tensor Filled(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  absl::StatusOr<Tensor> t = Tensor::Empty(shape, DType::kF32);
  Check(t.status());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t->data<float>();
  for (int64_t i = 0; i < t->numel(); ++i) p[i] = dist(rng);
  return *t;
}

Tensor Empty(const Shape& shape, DType dtype = DType::kF32) {
  absl::StatusOr<Tensor> t = Tensor::Zeros(shape, dtype);
  Check(t.status());
  return *t;
}

// Median seconds per call of fn: one warm-up sample, each sample repeats fn
// enough times to last >= 2 ms.
double MedianSecondsOnce(const std::function<void()>& fn) {
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  fn();
  auto t0 = Clock::now();
  fn();
  const double once = std::chrono::duration<double>(Clock::now() - t0).count();
  const int inner = std::max(1, static_cast<int>(2e-3 / std::max(once, 1e-9)));
  std::vector<double> samples;
  for (int r = 0; r < reps + 1; ++r) {  // the first sample is a warm-up
    t0 = Clock::now();
    for (int i = 0; i < inner; ++i) fn();
    samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
  }
  samples.erase(samples.begin());
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// The fastest of --rounds medians (rounds separated by a short pause).
double MedianSeconds(const std::function<void()>& fn) {
  double best = MedianSecondsOnce(fn);
  for (int r = 1; r < absl::GetFlag(FLAGS_rounds); ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    best = std::min(best, MedianSecondsOnce(fn));
  }
  return best;
}

// ---------------------------------------------------------------- GEMM ----

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Blas {
  std::string name;
  CblasSgemm sgemm = nullptr;
  std::string why_missing;
};

Blas LoadBlas(const std::string& name, const char* soname, const char* set_threads_symbol) {
  Blas b{name, nullptr, ""};
  void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    b.why_missing = absl::StrFormat("not installed (%s)", dlerror());
    return b;
  }
  b.sgemm = reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
  if (b.sgemm == nullptr) {
    b.why_missing = absl::StrFormat("%s has no cblas_sgemm", soname);
    return b;
  }
  // Same thread count as ours (BLIS defaults to 1 thread).
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(h, set_threads_symbol))) {
    set(omp_get_max_threads());
  }
  return b;
}

struct GemmShape {
  const char* layer;
  const char* pass;
  int64_t m, n, k;
  bool ta, tb;
};

struct GemmRow {
  GemmShape shape;
  double ours, onednn;
  std::vector<double> libs;  // per Blas, 0 if missing
  double ratio;
};

std::vector<GemmShape> LayerGemms() {
  struct Linear {
    const char* name;
    int64_t out, in;
  };
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  std::vector<Linear> linears = {
      {"QKV", 2304, 768}, {"attn-out", 768, 768}, {"MLP up", 3072, 768}, {"MLP down", 768, 3072}};
  if (absl::GetFlag(FLAGS_vocab) > 0)
    linears.push_back({"logits", absl::GetFlag(FLAGS_vocab), 768});
  std::vector<GemmShape> shapes;
  for (const Linear& l : linears) {
    shapes.push_back({l.name, "fwd Y=X.W^T", tokens, l.out, l.in, false, true});
    shapes.push_back({l.name, "dX=dY.W", tokens, l.in, l.out, false, false});
    shapes.push_back({l.name, "dW=dY^T.X", l.out, l.in, tokens, true, false});
  }
  return shapes;
}

std::vector<GemmRow> BenchGemm(const std::vector<Blas>& blas) {
  std::vector<GemmRow> rows;
  for (const GemmShape& s : LayerGemms()) {
    const Tensor a = s.ta ? Filled({s.k, s.m}, 1) : Filled({s.m, s.k}, 1);
    const Tensor b = s.tb ? Filled({s.n, s.k}, 2) : Filled({s.k, s.n}, 2);
    Tensor c = Empty({s.m, s.n});
    const int64_t lda = a.dim(1), ldb = b.dim(1), ldc = s.n;
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* pc = c.data<float>();
    const double gflop = 2.0 * s.m * s.n * s.k * 1e-9;
    GemmRow row{s, 0, 0, {}, 0};
    const cpu::MatmulOptions opts{s.ta, s.tb, 1.0f, 0.0f};
    row.ours = gflop / MedianSeconds([&] { Check(cpu::Matmul(a, b, &c, opts)); });
    row.onednn = gflop / MedianSeconds([&] {
                   dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f, pa, lda, pb,
                              ldb, 0.0f, pc, ldc);
                 });
    double best = row.onednn;
    for (const Blas& l : blas) {
      double v = 0.0;
      if (l.sgemm != nullptr) {
        v = gflop / MedianSeconds([&] {
              l.sgemm(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, s.m, s.n, s.k,
                      1.0f, pa, lda, pb, ldb, 0.0f, pc, ldc);
            });
      }
      row.libs.push_back(v);
      best = std::max(best, v);
    }
    row.ratio = row.ours / best;
    rows.push_back(row);
  }
  return rows;
}

// ----------------------------------------------------------- bf16 GEMM ----

// bf16 operands, f32 accumulation and result (what --bf16 on the CPU runs)
// against f32, at GPT-2-small's Linear shapes and its LM head (vocabulary
// 50257, hidden 768) for M = 256 and 1024 tokens. "bf16" rounds both f32
// operands into bf16 per call (as the dW GEMM, whose operands are both
// activations); "bf16 w" passes the weight already in bf16 (the parameters'
// compute copy, as the forward and dX GEMMs do), so only the activation is
// rounded per call.
void BenchGemmBf16(std::string* json) {
  const absl::Status support = cpu::CheckBf16GemmSupport("the bf16 GEMM table");
  const cpu::CpuFeatures& f = cpu::HostCpuFeatures();
  std::printf("\nbf16 GEMM (oneDNN matmul, f32 accumulation) vs f32 (dnnl_sgemm), TFLOP/s; CPU: %s "
              "(AVX512_BF16 %s, AMX-BF16 %s)\n",
              f.model.c_str(), f.avx512_bf16 ? "yes" : "no", f.amx_bf16 ? "yes" : "no");
  *json += ",\"bf16_gemm\":[";
  if (!support.ok()) {
    std::printf("skipped: %s\n", std::string(support.message()).c_str());
    *json += "]";
    return;
  }
  struct Weight {
    const char* name;
    int64_t out, in;
  };
  const Weight weights[] = {{"768x768", 768, 768},
                            {"3072x768", 3072, 768},
                            {"768x3072", 768, 3072},
                            {"50257x768", 50257, 768}};
  std::printf("%-10s %-12s %5s %5s %5s %2s  %8s %8s %8s %9s\n", "weight", "pass", "M", "N", "K",
              "op", "f32", "bf16", "bf16 w", "best/f32");
  bool first = true;
  for (const int64_t tokens : {int64_t{256}, int64_t{1024}}) {
    for (const Weight& w : weights) {
      const GemmShape shapes[] = {
          {w.name, "fwd Y=X.W^T", tokens, w.out, w.in, false, true},
          {w.name, "dX=dY.W", tokens, w.in, w.out, false, false},
          {w.name, "dW=dY^T.X", w.out, w.in, tokens, true, false},
      };
      for (const GemmShape& s : shapes) {
        const Tensor a = s.ta ? Filled({s.k, s.m}, 1) : Filled({s.m, s.k}, 1);
        const Tensor b = s.tb ? Filled({s.n, s.k}, 2) : Filled({s.k, s.n}, 2);
        Tensor c = Empty({s.m, s.n});
        const bool weight_b = s.pass[0] != 'd' || s.pass[1] != 'W';  // fwd and dX multiply W
        Tensor b16 = Empty(b.shape(), DType::kBF16);
        Check(cpu::Convert(b, &b16));
        const double tflop = 2.0 * s.m * s.n * s.k * 1e-12;
        const cpu::MatmulOptions f32{s.ta, s.tb, 1.0f, 0.0f};
        cpu::MatmulOptions bf16 = f32;
        bf16.bf16 = true;
        // The variants take turns, each round a median of --reps; the best
        // round of each is reported (a shared machine's load hits all alike).
        double s_f32 = 1e30, s_bf16 = 1e30, s_w = 1e30;
        for (int r = 0; r < std::max(1, absl::GetFlag(FLAGS_rounds)); ++r) {
          s_f32 = std::min(s_f32, MedianSecondsOnce([&] { Check(cpu::Matmul(a, b, &c, f32)); }));
          s_bf16 = std::min(s_bf16, MedianSecondsOnce([&] { Check(cpu::Matmul(a, b, &c, bf16)); }));
          if (weight_b) {
            s_w = std::min(s_w, MedianSecondsOnce([&] { Check(cpu::Matmul(a, b16, &c, f32)); }));
          }
        }
        const double t_f32 = tflop / s_f32, t_bf16 = tflop / s_bf16;
        const double t_w = weight_b ? tflop / s_w : 0.0;
        const std::string op = std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N");
        std::printf("%-10s %-12s %5lld %5lld %5lld %2s  %8.3f %8.3f ", s.layer, s.pass,
                    static_cast<long long>(s.m), static_cast<long long>(s.n),
                    static_cast<long long>(s.k), op.c_str(), t_f32, t_bf16);
        if (weight_b) {
          std::printf("%8.3f", t_w);
        } else {
          std::printf("%8s", "-");
        }
        std::printf(" %8.2fx\n", std::max(t_bf16, t_w) / t_f32);
        std::fflush(stdout);
        *json += absl::StrFormat(
            "%s{\"weight\":\"%s\",\"pass\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,"
            "\"f32_tflops\":%.4f,\"bf16_tflops\":%.4f,\"bf16_w_tflops\":%.4f}",
            first ? "" : ",", s.layer, s.pass, s.m, s.n, s.k, t_f32, t_bf16, t_w);
        first = false;
      }
    }
  }
  *json += "]";
}

// ---------------------------------------------------------- element-wise ----

struct EwRow {
  std::string kernel;
  std::string shape;
  double bytes;
  double gbps, memcpy_gbps, ratio;
};

// A memcpy of bytes / 2 (so `bytes` read + written in total) with all
// threads, each copying its contiguous share: the same thread count and the
// same traffic as the kernel it is compared with.
struct Memcpy {
  std::vector<char> src, dst;
  explicit Memcpy(double bytes)
      : src(static_cast<size_t>(bytes / 2), 1), dst(static_cast<size_t>(bytes / 2), 0) {}
  void operator()() {
    const size_t n = src.size();
#pragma omp parallel
    {
      const size_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const size_t lo = n * t / nt, hi = n * (t + 1) / nt;
      std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
    }
  }
};

// Seconds per call of fn, one sample (fn repeated `inner` times).
double Sample(const std::function<void()>& fn, int inner) {
  const auto t0 = Clock::now();
  for (int i = 0; i < inner; ++i) fn();
  return std::chrono::duration<double>(Clock::now() - t0).count() / inner;
}

int InnerFor(const std::function<void()>& fn) {
  fn();
  return std::max(1, static_cast<int>(2e-3 / std::max(Sample(fn, 1), 1e-9)));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<EwRow> BenchElementwise() {
  std::vector<EwRow> rows;
  // Kernel and memcpy samples alternate (reps * rounds pairs), so a stretch
  // slowed by other processes hits both; ratio = median over pairs of
  // t_memcpy / t_kernel; the GB/s columns are the medians of each.
  auto add = [&](const std::string& kernel, const std::string& shape, double bytes,
                 const std::function<void()>& fn) {
    if (kernel.find(absl::GetFlag(FLAGS_filter)) == std::string::npos) return;
    Memcpy mc(bytes);
    const std::function<void()> copy = [&] { mc(); };
    const int inner_k = InnerFor(fn), inner_m = InnerFor(copy);
    const int pairs = std::max(1, absl::GetFlag(FLAGS_reps)) * std::max(1, absl::GetFlag(FLAGS_rounds));
    std::vector<double> tk, tm, ratio;
    for (int i = 0; i < pairs; ++i) {
      tk.push_back(Sample(fn, inner_k));
      tm.push_back(Sample(copy, inner_m));
      ratio.push_back(tm.back() / tk.back());
    }
    if (absl::GetFlag(FLAGS_best)) {
      const double k = *std::min_element(tk.begin(), tk.end());
      const double m = *std::min_element(tm.begin(), tm.end());
      rows.push_back({kernel, shape, bytes, bytes / k * 1e-9, bytes / m * 1e-9, m / k});
      return;
    }
    rows.push_back({kernel, shape, bytes, bytes / Median(tk) * 1e-9, bytes / Median(tm) * 1e-9,
                    Median(ratio)});
  };
  for (const int64_t c : {int64_t{768}, int64_t{3072}}) {
    const int64_t n = 1024;
    const double e = static_cast<double>(n * c);
    const std::string shape = absl::StrFormat("[%d, %d]", n, c);
    const Tensor x = Filled({n, c}, 1), dout = Filled({n, c}, 2), bias = Filled({c}, 3);
    Tensor out = Empty({n, c}), dx = Empty({n, c}), dbias = Empty({c});
    add("bias add fwd", shape, 8 * e, [&] { Check(cpu::BiasAddForward(x, bias, &out)); });
    add("bias add bwd (dbias)", shape, 4 * e, [&] { Check(cpu::BiasAddBackward(dout, &dbias)); });
    add("residual add", shape, 12 * e, [&] { Check(cpu::Add(x, dout, &out)); });
    add("gelu fwd", shape, 8 * e, [&] { Check(cpu::GeluForward(x, &out)); });
    add("gelu bwd", shape, 12 * e, [&] { Check(cpu::GeluBackward(x, dout, &dx)); });
    Tensor gamma = Filled({c}, 4), beta = Filled({c}, 5), mean = Empty({n}), rstd = Empty({n});
    Tensor dgamma = Empty({c}), dbeta = Empty({c});
    add("layernorm fwd", shape, 8 * e,
        [&] { Check(cpu::LayerNormForward(x, gamma, beta, 1e-5f, &out, &mean, &rstd)); });
    add("layernorm bwd", shape, 12 * e,
        [&] { Check(cpu::LayerNormBackward(dout, x, gamma, mean, rstd, &dx, &dgamma, &dbeta)); });
    add("rmsnorm fwd", shape, 8 * e,
        [&] { Check(cpu::RmsNormForward(x, gamma, 1e-6f, &out, &rstd)); });
    add("rmsnorm bwd", shape, 12 * e,
        [&] { Check(cpu::RmsNormBackward(dout, x, gamma, rstd, &dx, &dgamma)); });
    {
      // x as [gate | up] of F = C/2 each; heads of Llama's 128 dims.
      const Tensor dhalf = Filled({n, c / 2}, 9);
      Tensor half = Empty({n, c / 2});
      add("swiglu fwd", shape, 6 * e, [&] { Check(cpu::SwigluForward(x, &half)); });
      add("swiglu bwd", shape, 10 * e, [&] { Check(cpu::SwigluBackward(dhalf, x, &dx)); });
      const Shape heads{n, 1, c / 128, 128};
      const Tensor x4 = *x.Reshape(heads);
      Tensor out4 = *out.Reshape(heads);
      add("rope fwd", shape, 8 * e, [&] { Check(cpu::RopeForward(x4, {}, &out4)); });
      add("rope bwd", shape, 8 * e, [&] { Check(cpu::RopeBackward(x4, {}, &out4)); });
    }
    add("softmax fwd", shape, 8 * e, [&] { Check(cpu::SoftmaxForward(x, &out)); });
    add("softmax bwd", shape, 12 * e, [&] { Check(cpu::SoftmaxBackward(out, dout, &dx)); });
    const cpu::DropoutOptions drop{0.1f, 1234, 0};
    add("dropout fwd", shape, 8 * e, [&] { Check(cpu::DropoutForward(x, &out, drop)); });
    add("dropout bwd", shape, 8 * e, [&] { Check(cpu::DropoutBackward(dout, &dx, drop)); });
    {
      Tensor p = Filled({n, c}, 6), g = Filled({n, c}, 7, -1e-3f, 1e-3f);
      Tensor m = Empty({n, c}), v = Empty({n, c});
      int64_t step = 0;
      const cpu::AdamWOptions o{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
      add("adamw step", shape, 28 * e, [&] { Check(cpu::AdamWStep(&p, g, &m, &v, ++step, o)); });
    }
    {
      Tensor b16 = Empty({n, c}, DType::kBF16);
      add("f32 -> bf16", shape, 6 * e, [&] { Check(cpu::Convert(x, &b16)); });
      add("bf16 -> f32", shape, 6 * e, [&] { Check(cpu::Convert(b16, &out)); });
    }
    if (c == 768) {
      // Token embedding of the GPT-2 vocab: 1024 ids into a [50257, 768] table.
      const int64_t vocab = 50257;
      const Tensor table = Filled({vocab, c}, 8);
      Tensor dtable = Empty({vocab, c});
      Tensor ids = Empty({n}, DType::kI32);
      std::mt19937 rng(9);
      for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = rng() % vocab;
      add("embedding fwd", shape, 8 * e, [&] { Check(cpu::EmbeddingForward(ids, table, &out)); });
      add("embedding bwd", shape, 12 * e,
          [&] { Check(cpu::EmbeddingBackward(ids, dout, &dtable)); });
    }
  }
  return rows;
}

// Attention of one GPT-2-small layer (s=1024, b=1, 12 heads of 64), as
// GFLOP/s of the useful causal work (QKᵀ and PV: 2 * 2 * s^2/2 * d per head).
void BenchAttention(std::string* json) {
  const int64_t s = 1024, b = 1, heads = 12, d = 64;
  const Tensor qkv = Filled({s, b, heads * 3 * d}, 1);
  const Tensor dout = Filled({s, b, heads * d}, 2);
  Tensor out = Empty({s, b, heads * d}), probs = Empty({b, heads, s, s});
  Tensor dqkv = Empty({s, b, heads * 3 * d});
  const double fwd_gflop = 2.0 * 2.0 * (s * (s + 1) / 2.0) * d * heads * b * 1e-9;
  const double tf = MedianSeconds([&] { Check(cpu::AttentionForward(qkv, heads, &out, &probs)); });
  const double tb =
      MedianSeconds([&] { Check(cpu::AttentionBackward(dout, qkv, probs, heads, &dqkv)); });
  std::printf("\nCausal attention, s=%lld b=%lld heads=%lld d=%lld (causal FLOPs only)\n",
              static_cast<long long>(s), static_cast<long long>(b), static_cast<long long>(heads),
              static_cast<long long>(d));
  std::printf("  forward   %8.3f ms  %7.1f GFLOP/s\n", tf * 1e3, fwd_gflop / tf);
  std::printf("  backward  %8.3f ms  %7.1f GFLOP/s\n", tb * 1e3, 2 * fwd_gflop / tb);
  *json += absl::StrFormat(",\"attention\":{\"fwd_ms\":%.4f,\"bwd_ms\":%.4f}", tf * 1e3, tb * 1e3);
}

int Main() {
  const int threads = omp_get_max_threads();
  std::printf(
      "loom //core:bench  threads=%d  median of %d samples, best of %d rounds  "
      "OPENBLAS_CORETYPE=%s\n\n",
      threads, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_rounds),
      std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
  std::vector<Blas> blas = {LoadBlas("OpenBLAS", "libopenblas.so.0", "openblas_set_num_threads"),
                            LoadBlas("BLIS", "libblis.so.4", "bli_thread_set_num_threads")};
  for (const Blas& b : blas) {
    if (b.sgemm == nullptr) std::printf("%s: %s\n", b.name.c_str(), b.why_missing.c_str());
  }
  std::string json = "{\"gemm\":[";
  if (absl::GetFlag(FLAGS_gemm)) {
    std::printf("GEMM, GPT-2-small layer (%lld tokens, hidden 768), GFLOP/s\n",
                static_cast<long long>(absl::GetFlag(FLAGS_tokens)));
    std::printf("%-9s %-12s %5s %5s %5s %2s  %8s %8s", "layer", "pass", "M", "N", "K", "op", "ours",
                "oneDNN");
    for (const Blas& b : blas) std::printf(" %8s", b.name.c_str());
    std::printf(" %10s\n", "ours/best");
    const std::vector<GemmRow> gemm = BenchGemm(blas);
    for (size_t i = 0; i < gemm.size(); ++i) {
      const GemmRow& r = gemm[i];
      const std::string op = std::string(r.shape.ta ? "T" : "N") + (r.shape.tb ? "T" : "N");
      std::printf("%-9s %-12s %5lld %5lld %5lld %2s  %8.1f %8.1f", r.shape.layer, r.shape.pass,
                  static_cast<long long>(r.shape.m), static_cast<long long>(r.shape.n),
                  static_cast<long long>(r.shape.k), op.c_str(), r.ours, r.onednn);
      for (double v : r.libs) {
        if (v > 0) {
          std::printf(" %8.1f", v);
        } else {
          std::printf(" %8s", "n/a");
        }
      }
      std::printf(" %9.2fx\n", r.ratio);
      json += absl::StrFormat(
          "%s{\"layer\":\"%s\",\"pass\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"ours\":%.2f,"
          "\"onednn\":%.2f,\"openblas\":%.2f,\"blis\":%.2f,\"ratio\":%.3f}",
          i ? "," : "", r.shape.layer, r.shape.pass, r.shape.m, r.shape.n, r.shape.k, r.ours,
          r.onednn, r.libs[0], r.libs[1], r.ratio);
    }
  }
  json += "]";
  if (absl::GetFlag(FLAGS_bf16_gemm)) BenchGemmBf16(&json);
  json += ",\"elementwise\":[";
  if (absl::GetFlag(FLAGS_elementwise)) {
    std::printf(
        "\nElement-wise kernels, GB/s counting bytes read + written; memcpy moves the same "
        "bytes\n");
    std::printf("%-22s %-13s %9s %9s %9s %8s\n", "kernel", "shape", "MB", "GB/s", "memcpy",
                "ratio");
    const std::vector<EwRow> ew = BenchElementwise();
    for (size_t i = 0; i < ew.size(); ++i) {
      const EwRow& r = ew[i];
      std::printf("%-22s %-13s %9.1f %9.1f %9.1f %7.2fx\n", r.kernel.c_str(), r.shape.c_str(),
                  r.bytes * 1e-6, r.gbps, r.memcpy_gbps, r.ratio);
      json += absl::StrFormat(
          "%s{\"kernel\":\"%s\",\"shape\":\"%s\",\"gbps\":%.2f,"
          "\"memcpy_gbps\":%.2f,\"ratio\":%.3f}",
          i ? "," : "", r.kernel, r.shape, r.gbps, r.memcpy_gbps, r.ratio);
    }
    json += "]";
    BenchAttention(&json);
  } else {
    json += "]";
  }
  json += "}";
  if (absl::GetFlag(FLAGS_json)) std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace loom::core

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::core::Main();
}
