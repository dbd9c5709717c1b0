// //core/cpu:attention_bench — the s x s attention kernel (attention.h) against
// the flash kernel (flash_attention.h), forward + backward, in the same run.
//
//   bazel run -c opt //core/cpu:attention_bench [-- --sizes=512,1024 --b=1 --heads=12 --d=64
//                                                 --dropout=0.1 --reps=3 --max_old_gib=4]
//
// For each s the two kernels alternate (old, new, old, new, ...) --reps times
// and the median of each is reported, so both see the same machine load.
// The old kernel is skipped where its s x s buffers (probs kept from forward
// to backward, plus the backward's per-thread dS and dropped-P scratch) would
// exceed --max_old_gib. Memory columns: the bytes each kernel keeps or
// allocates beyond qkv/out/dqkv. Speed lives here; tests never time things.

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/bench_util/bench_util.h"
#include "core/cpu/attention.h"
#include "core/cpu/flash_attention.h"
#include "core/tensor.h"

ABSL_FLAG(std::string, sizes, "512,1024,2048,4096,8192", "sequence lengths");
ABSL_FLAG(int64_t, b, 1, "micro-batch size");
ABSL_FLAG(int64_t, heads, 12, "heads (GPT-2 small: 12)");
ABSL_FLAG(int64_t, d, 64, "head dim (GPT-2 small: 64)");
ABSL_FLAG(double, dropout, 0.1, "attention dropout p (GPT-2 trains with 0.1)");
ABSL_FLAG(int, reps, 3, "alternating samples per kernel and size (median reported)");
ABSL_FLAG(double, max_old_gib, 4.0, "skip the s x s kernel above this many GiB of s x s buffers");

namespace loom::core::cpu {
namespace {

using Clock = std::chrono::steady_clock;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

Tensor Filled(const Shape& shape, uint64_t seed) {
  absl::StatusOr<Tensor> t = Tensor::Empty(shape, DType::kF32);
  Check(t.status());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  float* p = t->data<float>();
  for (int64_t i = 0; i < t->numel(); ++i) p[i] = dist(rng);
  return *t;
}

Tensor Empty(const Shape& shape) {
  absl::StatusOr<Tensor> t = Tensor::Empty(shape, DType::kF32);
  Check(t.status());
  return *t;
}

using bench::CpuModel;
using bench::Median;

double Best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

std::string Bytes(double bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1ull << 20));
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f KiB", bytes / 1024);
  }
  return buf;
}

int Main() {
  const int64_t b = absl::GetFlag(FLAGS_b), heads = absl::GetFlag(FLAGS_heads),
                d = absl::GetFlag(FLAGS_d);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const float p = static_cast<float>(absl::GetFlag(FLAGS_dropout));
  const AttentionDropout dropout{p, 1234, 5678, 0, 0};
  const int threads = omp_get_max_threads();
  std::printf("CPU: %s, %d OpenMP threads\n", CpuModel().c_str(), threads);
  std::printf("causal attention forward + backward, b=%lld heads=%lld d=%lld dropout=%.2f; "
              "median of %d alternating samples (ms); also the fastest sample of each\n\n",
              (long long)b, (long long)heads, (long long)d, p, reps);
  std::printf("| s | s x s kernel, ms (fwd + bwd) | flash, ms (fwd + bwd) | old / flash (medians) | fastest samples: old / flash | old: "
              "s x s buffers | flash: extra memory |\n|---|---|---|---|---|---|---|\n");
  for (const absl::string_view tok : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int64_t s = 0;
    if (!absl::SimpleAtoi(tok, &s) || s <= 0) continue;
    const Tensor qkv = Filled({s, b, heads * 3 * d}, 1);
    const Tensor dout = Filled({s, b, heads * d}, 2);
    Tensor out = Empty({s, b, heads * d}), dqkv = Empty(qkv.shape());
    Tensor lse = Empty({b, heads, s});
    // probs [b, heads, s, s] from forward to backward; the backward's
    // per-thread dS (and, with dropout, dropped P) [s, s].
    const double ss = 4.0 * static_cast<double>(s) * s;
    const int busy = static_cast<int>(std::min<int64_t>(threads, b * heads));
    const double old_bytes = ss * b * heads + ss * (p > 0 ? 2 : 1) * busy;
    // lse [b, heads, s]; per thread: 3 tiles of 128 x 256, a 128 x (d + 2)
    // running state and the backward's delta [s].
    const double flash_bytes = 4.0 * b * heads * s +
                               threads * 4.0 * (3 * 128 * 256 + 128 * (d + 2) + s);
    const bool run_old = old_bytes <= absl::GetFlag(FLAGS_max_old_gib) * (1ull << 30);
    Tensor probs;
    if (run_old) probs = Empty({b, heads, s, s});
    auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    // Each sample: {forward, backward} in ms.
    auto time_old = [&](std::vector<double>* fwd, std::vector<double>* bwd) {
      const auto t0 = Clock::now();
      Check(AttentionForward(qkv, heads, &out, &probs, dropout));
      const auto t1 = Clock::now();
      Check(AttentionBackward(dout, qkv, probs, heads, &dqkv, dropout));
      fwd->push_back(ms(t0, t1));
      bwd->push_back(ms(t1, Clock::now()));
    };
    auto time_flash = [&](std::vector<double>* fwd, std::vector<double>* bwd) {
      const auto t0 = Clock::now();
      Check(FlashAttentionForward(qkv, heads, &out, &lse, dropout));
      const auto t1 = Clock::now();
      Check(FlashAttentionBackward(dout, qkv, out, lse, heads, &dqkv, dropout));
      fwd->push_back(ms(t0, t1));
      bwd->push_back(ms(t1, Clock::now()));
    };
    std::vector<double> of, ob, ff, fb, o_sum, f_sum;
    if (run_old) time_old(&of, &ob);  // warm-up (page faults of probs)
    time_flash(&ff, &fb);
    of.clear(), ob.clear(), ff.clear(), fb.clear();
    for (int r = 0; r < reps; ++r) {
      if (run_old) {
        time_old(&of, &ob);
        o_sum.push_back(of.back() + ob.back());
      }
      time_flash(&ff, &fb);
      f_sum.push_back(ff.back() + fb.back());
    }
    const double f = Median(f_sum);
    if (run_old) {
      const double o = Median(o_sum);
      std::printf("| %lld | %.1f (%.1f + %.1f) | %.1f (%.1f + %.1f) | %.2fx | %.1f / %.1f = %.2fx "
                  "| %s | %s |\n",
                  (long long)s, o, Median(of), Median(ob), f, Median(ff), Median(fb), o / f,
                  Best(o_sum), Best(f_sum), Best(o_sum) / Best(f_sum), Bytes(old_bytes).c_str(),
                  Bytes(flash_bytes).c_str());
    } else {
      std::printf("| %lld | skipped | %.1f (%.1f + %.1f) | - | - / %.1f | %s | %s |\n",
                  (long long)s, f, Median(ff), Median(fb), Best(f_sum), Bytes(old_bytes).c_str(),
                  Bytes(flash_bytes).c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace loom::core::cpu

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::core::cpu::Main();
}
