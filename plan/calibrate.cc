#include "plan/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/comm.h"
#include "comm/local/communicator.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

namespace loom::plan {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// An f32 tensor of `shape` with every element written (0.01): a fresh
// allocation's pages are all the kernel's zero page until written, and a
// kernel reading them would run from the cache.
absl::StatusOr<core::Tensor> Filled(const core::Shape& shape) {
  absl::StatusOr<core::Tensor> t = core::Tensor::Zeros(shape, core::DType::kF32);
  if (!t.ok()) return t.status();
  std::fill(t->data<float>(), t->data<float>() + t->numel(), 0.01f);
  return t;
}

// Best of `reps` runs of fn, seconds.
absl::StatusOr<double> Best(int reps, const std::function<absl::Status()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = Now();
    if (absl::Status s = fn(); !s.ok()) return s;
    best = std::min(best, Now() - t0);
  }
  return best;
}

// Seconds of one collective between 2 threads of a local world (best of 5).
absl::StatusOr<double> TimeCollective(const char* kind, int64_t bytes) {
  auto world = comm::local::CreateWorld(2);
  if (!world.ok()) return world.status();
  const int64_t n = std::max<int64_t>(2, bytes / 4 / 2 * 2);
  std::vector<double> secs(2, 0);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      comm::Communicator* c = (*world)[rank].get();
      auto in = core::Tensor::Zeros({n}, core::DType::kF32);
      auto out = core::Tensor::Zeros({n}, core::DType::kF32);
      auto half = core::Tensor::Zeros({n / 2}, core::DType::kF32);
      if (!in.ok() || !out.ok() || !half.ok()) {
        statuses[rank] = absl::ResourceExhaustedError("calibrate: allocation failed");
        return;
      }
      auto run = [&]() -> absl::Status {
        const std::string k = kind;
        if (k == "all_reduce") return c->AllReduce(*in, *out, comm::ReduceOp::kSum)->Wait();
        if (k == "all_gather") return c->AllGather(*half, *out)->Wait();
        if (k == "reduce_scatter") {
          return c->ReduceScatter(*in, *half, comm::ReduceOp::kSum)->Wait();
        }
        return c->AllToAll(*in, *out)->Wait();
      };
      for (int i = 0; i < 2; ++i) {
        if (absl::Status s = run(); !s.ok()) {
          statuses[rank] = s;
          return;
        }
      }
      auto t = Best(5, run);
      statuses[rank] = t.status();
      if (t.ok()) secs[rank] = *t;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return std::max(secs[0], secs[1]);
}

// Seconds per call of each of `kernels`, summed: each kernel called back to
// back for a window of at least 25 ms (one call at least), the faster of two
// windows, after one warm-up call. Sustained windows, not the best single
// call: on a shared machine a short OpenMP kernel's best call is far from
// what it averages inside a training step (its two threads must run at the
// same time: under load each parallel region can wait a scheduler tick), and
// a window sees the same share of the cores as the step measured after it.
absl::StatusOr<double> SumOfSustained(const std::vector<std::function<absl::Status()>>& kernels,
                                      std::vector<double>* per_call = nullptr) {
  constexpr double kWindow = 0.025;
  std::vector<double> b(kernels.size(), 1e30);
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (absl::Status s = kernels[i](); !s.ok()) return s;
    for (int w = 0; w < 2; ++w) {
      const double t0 = Now();
      int calls = 0;
      do {
        if (absl::Status s = kernels[i](); !s.ok()) return s;
        ++calls;
      } while (Now() - t0 < kWindow);
      b[i] = std::min(b[i], (Now() - t0) / calls);
    }
  }
  double sum = 0;
  for (double t : b) sum += t;
  if (per_call != nullptr) *per_call = b;
  return sum;
}

// A GPT layer's linear GEMMs at hidden size h and T = max(256, h) tokens,
// as layers/linear.cc runs them: forward y = x·wᵀ (NT), dX = dY·w (NN) and
// dW += dYᵀ·x (TN, accumulating), for QKV (3h), the projection (h), MLP up
// (4h) and down: seconds of the set (SumOfSustained). `peak` gets the fastest
// GEMM's FLOP/s.
absl::StatusOr<double> TimeLayerGemms(int64_t h, double* peak) {
  const int64_t tokens = std::max<int64_t>(256, h);
  // Every output is computed from inputs no kernel writes (dw accumulates
  // linearly): no value grows from call to call into inf, NaN or denormals.
  struct Linear {
    core::Tensor x, w, y, dy, dx, dw;
  };
  std::vector<Linear> linears;
  for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{
           {3 * h, h}, {h, h}, {4 * h, h}, {h, 4 * h}}) {
    auto x = Filled({tokens, in}), w = Filled({out, in}), y = Filled({tokens, out}),
         dy = Filled({tokens, out}), dx = Filled({tokens, in}), dw = Filled({out, in});
    for (const auto* t : {&x, &w, &y, &dy, &dx, &dw}) {
      if (!t->ok()) return absl::ResourceExhaustedError("calibrate: GEMM buffers");
    }
    linears.push_back({*x, *w, *y, *dy, *dx, *dw});
  }
  std::vector<std::function<absl::Status()>> gemms;
  std::vector<double> flops;
  for (Linear& l : linears) {
    gemms.push_back([&l] { return core::ops::Matmul(l.x, l.w, &l.y, {false, true}); });
    gemms.push_back([&l] { return core::ops::Matmul(l.dy, l.w, &l.dx); });
    gemms.push_back([&l] { return core::ops::Matmul(l.dy, l.x, &l.dw, {true, false, 1.0f, 1.0f}); });
    flops.insert(flops.end(), 3, 2.0 * l.x.dim(0) * l.w.dim(0) * l.w.dim(1));
  }
  std::vector<double> best;
  absl::StatusOr<double> sum = SumOfSustained(gemms, &best);
  if (!sum.ok()) return sum.status();
  for (size_t i = 0; i < best.size(); ++i) *peak = std::max(*peak, flops[i] / best[i]);
  return *sum;
}

// Flash attention forward and backward (b = 1, 8 heads of 64, causal) at
// sequence length s: SumOfSustained's seconds per call of each.
absl::StatusOr<std::pair<double, double>> TimeAttention(int64_t s) {
  const int64_t heads = 8, d = 64;
  auto qkv = Filled({s, 1, heads * 3 * d}), dqkv = Filled({s, 1, heads * 3 * d});
  auto out = Filled({s, 1, heads * d}), dout = Filled({s, 1, heads * d});
  auto lse = Filled({1, heads, s});
  if (!qkv.ok() || !dqkv.ok() || !out.ok() || !dout.ok() || !lse.ok()) {
    return absl::ResourceExhaustedError("calibrate: attention buffers");
  }
  std::vector<double> per_call;
  absl::StatusOr<double> sum = SumOfSustained(
      {[&] { return core::ops::FlashAttentionForward(*qkv, heads, &*out, &*lse); },
       [&] { return core::ops::FlashAttentionBackward(*dout, *qkv, *out, *lse, heads, &*dqkv); }},
      &per_call);
  if (!sum.ok()) return sum.status();
  return std::make_pair(per_call[0], per_call[1]);
}

// Adam over n f32 elements as the trainer runs it: the squared gradient norm
// (clipping), then the update: SumOfSustained, seconds.
absl::StatusOr<double> TimeOptimizer(int64_t n) {
  auto p = Filled({n}), g = Filled({n}), m = Filled({n}), v = Filled({n});
  auto acc = core::Tensor::Zeros({1}, core::DType::kF64);
  if (!p.ok() || !g.ok() || !m.ok() || !v.ok() || !acc.ok()) {
    return absl::ResourceExhaustedError("calibrate: optimizer buffers");
  }
  int64_t step = 0;
  return SumOfSustained({[&] { return core::ops::SumSquaresInto(*g, &*acc); },
                       [&] { return core::ops::AdamWStep(&*p, *g, &*m, &*v, ++step, {}); }});
}

}  // namespace

CpuRates CpuRatesFromTimes(const CpuTimes& t) {
  auto point = [](double flops, double efficiency) {
    GemmPoint p;
    p.set_flops(flops);
    p.set_efficiency(efficiency);
    return p;
  };
  CpuRates r;
  r.peak_flops = t.peak_flops;
  for (const auto& [h, seconds] : t.layer_gemms) {
    const double tokens = std::max(256.0, static_cast<double>(h));
    const double flops = 2 * tokens * h * h * (3 + 1 + 4 + 4);  // the four GEMMs' forward
    // Each point at the layer's mean GEMM size; three GEMMs of each size per set.
    r.gemm_efficiency.push_back(point(flops / 4, std::min(1.0, 3 * flops / seconds / t.peak_flops)));
  }
  for (const CpuTimes::Attention& a : t.attention) {
    const double flops = 2.0 * a.seq * a.seq * a.heads * a.head_dim;  // QKᵀ and PV, causal half
    r.attention_efficiency.push_back(point(flops, std::min(1.0, flops / a.forward / t.peak_flops)));
    r.attention_backward_ratio += a.backward / a.forward / t.attention.size();
  }
  // Adam's bytes per f32 element in the time model: 7·4 + 4.
  r.optimizer_bandwidth = t.optimizer_elements * 32.0 / t.optimizer;
  return r;
}

absl::StatusOr<std::string> Calibrate() {
  CpuTimes times;
  for (int64_t h : {64, 128, 256, 512, 1024}) {
    auto t = TimeLayerGemms(h, &times.peak_flops);
    if (!t.ok()) return t.status();
    times.layer_gemms.push_back({h, *t});
  }
  for (int64_t s : {128, 512, 2048}) {
    auto t = TimeAttention(s);
    if (!t.ok()) return t.status();
    times.attention.push_back({s, 8, 64, t->first, t->second});
  }
  auto optimizer = TimeOptimizer(times.optimizer_elements);
  if (!optimizer.ok()) return optimizer.status();
  times.optimizer = *optimizer;
  const CpuRates rates = CpuRatesFromTimes(times);
  std::string gemm, attention;
  for (const GemmPoint& p : rates.gemm_efficiency) {
    absl::StrAppendFormat(&gemm, "gemm_efficiency { flops: %.6g efficiency: %.3f }\n", p.flops(),
                          p.efficiency());
  }
  for (const GemmPoint& p : rates.attention_efficiency) {
    absl::StrAppendFormat(&attention, "attention_curve { flops: %.6g efficiency: %.3f }\n",
                          p.flops(), p.efficiency());
  }
  // memcpy of 64 MiB: bytes read + written per second.
  const size_t bytes = 64 << 20;
  std::vector<char> src(bytes, 1), dst(bytes);
  auto copy = Best(5, [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    return absl::OkStatus();
  });
  if (!copy.ok()) return copy.status();
  const double bandwidth = 2.0 * bytes / *copy;

  std::string link;
  for (const char* kind : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) {
    auto small = TimeCollective(kind, 8);
    auto large = TimeCollective(kind, 4 << 20);
    if (!small.ok()) return small.status();
    if (!large.ok()) return large.status();
    // Bus bandwidth over 2 ranks: all-reduce moves 2(n-1)/n = 1 buffer, the
    // others (n-1)/n = 1/2 of the whole.
    const double factor = std::string(kind) == "all_reduce" ? 1.0 : 0.5;
    const double busbw = factor * (4 << 20) / std::max(1e-9, *large - *small);
    absl::StrAppendFormat(&link, "  %s { bus_bandwidth: %.4g latency: %.3g }\n", kind, busbw,
                          *small);
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return absl::StrCat(
      "# Measured by `bazel run //train:plan -- --calibrate` (plan/calibrate.cc), each kernel\n"
      "# back to back for 25 ms windows, through core/ops: a GPT layer's f32 GEMMs (forward NT,\n"
      "# dX NN, dW TN) at h = 64 .. 1024, flash attention (8 heads of 64, s = 128, 512, 2048),\n"
      "# Adam over 4M elements; a 64 MiB memcpy (also the element-wise kernels' rate); the local\n"
      "# backend's collectives between two threads (bus bandwidth from 4 MiB minus the 8 B\n"
      "# latency).\n",
      absl::StrFormat("name: \"cpu-%u-cores (calibrated)\"\n", cores),
      "source: \"//train:plan --calibrate\"\n",
      absl::StrFormat("device_memory_bytes: %.6g  # the host's RAM (ranks share it)\n",
                      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE)),
      absl::StrFormat("peak_flops: %.6g\n", rates.peak_flops), gemm,
      absl::StrFormat("memory_bandwidth: %.6g\n", bandwidth),
      absl::StrFormat("optimizer_bandwidth: %.6g\n", rates.optimizer_bandwidth),
      "devices_per_node: 64\nranks_share_compute: true\ncompute_dtype_bytes: 4\n", attention,
      absl::StrFormat("attention_backward_ratio: %.3f\n", rates.attention_backward_ratio),
      "intra_node {\n", link, "}\n", "inter_node {\n", link, "}\n");
}

std::vector<GemmShape> DeviceGemmShapes() {
  std::vector<GemmShape> shapes;
  for (int64_t n = 256; n <= 8192; n *= 2) shapes.push_back({n, n, n});
  const int64_t tokens = 4096;
  for (int64_t h : {2048, 4096, 6144, 8192, 12288, 18432}) {
    for (int64_t tp : {1, 2, 4, 8}) {
      shapes.push_back({tokens, 3 * h / tp, h});  // QKV
      shapes.push_back({tokens, h, h / tp});      // projection
      shapes.push_back({tokens, 4 * h / tp, h});  // MLP up
      shapes.push_back({tokens, h, 4 * h / tp});  // MLP down
    }
  }
  return shapes;
}

absl::StatusOr<Hardware> CalibrateDevice(const Hardware& base, core::Device device,
                                         core::DType dtype, const std::vector<GemmShape>& shapes,
                                         int64_t copy_bytes) {
  if (!(base.peak_flops() > 0)) {
    return absl::InvalidArgumentError("--calibrate on a device: --hardware needs peak_flops > 0");
  }
  // Repetitions of `fn` for about 20 ms at `rate`, then the best of 3 runs,
  // each ended by a synchronization (the device queues work asynchronously).
  auto time_per_call = [&](double work, double rate,
                           const std::function<absl::Status()>& fn) -> absl::StatusOr<double> {
    for (int i = 0; i < 2; ++i) {
      if (absl::Status s = fn(); !s.ok()) return s;
    }
    if (absl::Status s = core::ops::Synchronize(device); !s.ok()) return s;
    const int reps = static_cast<int>(std::clamp(0.02 * rate / std::max(1.0, work), 1.0, 1000.0));
    absl::StatusOr<double> best = Best(3, [&]() -> absl::Status {
      for (int i = 0; i < reps; ++i) {
        if (absl::Status s = fn(); !s.ok()) return s;
      }
      return core::ops::Synchronize(device);
    });
    if (!best.ok()) return best.status();
    return *best / reps;
  };
  std::map<double, std::pair<double, int>> by_flops;  // flops -> (sum of efficiencies, count)
  for (const GemmShape& g : shapes) {
    auto a = core::Tensor::Zeros({g.m, g.k}, dtype, device);
    auto b = core::Tensor::Zeros({g.k, g.n}, dtype, device);
    auto c = core::Tensor::Zeros({g.m, g.n}, dtype, device);
    if (!a.ok() || !b.ok() || !c.ok()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "--calibrate: GEMM buffers of %d x %d x %d on %s", g.m, g.n, g.k, device.ToString()));
    }
    const double flops = 2.0 * g.m * g.n * g.k;
    absl::StatusOr<double> t = time_per_call(flops, base.peak_flops() * 0.5,
                                             [&] { return core::ops::Matmul(*a, *b, &*c); });
    if (!t.ok()) return t.status();
    if (!(*t > 0)) return absl::InternalError("--calibrate: a GEMM took no time");
    auto& [sum, count] = by_flops[flops];
    sum += std::min(1.0, flops / *t / base.peak_flops());
    ++count;
  }
  Hardware hw = base;
  hw.clear_gemm_efficiency();
  for (const auto& [flops, sum_count] : by_flops) {
    GemmPoint* p = hw.add_gemm_efficiency();
    p->set_flops(flops);
    p->set_efficiency(sum_count.first / sum_count.second);
  }
  const int64_t elements = std::max<int64_t>(1, copy_bytes / 4);
  auto src = core::Tensor::Zeros({elements}, core::DType::kF32, device);
  auto dst = core::Tensor::Zeros({elements}, core::DType::kF32, device);
  if (!src.ok() || !dst.ok()) {
    return absl::ResourceExhaustedError("--calibrate: copy buffers on " + device.ToString());
  }
  absl::StatusOr<double> copy =
      time_per_call(2.0 * elements * 4, base.memory_bandwidth() > 0 ? base.memory_bandwidth() : 1e11,
                    [&] { return core::ops::Copy(*src, &*dst); });
  if (!copy.ok()) return copy.status();
  hw.set_memory_bandwidth(2.0 * elements * 4 / *copy);
  hw.set_source(absl::StrCat(
      "GEMM-efficiency curve (", core::DTypeName(dtype), ", against peak_flops ",
      absl::StrFormat("%.4g", base.peak_flops()), ") and memory bandwidth measured by //train:plan "
      "--calibrate on ", device.ToString(), " at ",
      absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::Now(), absl::UTCTimeZone()),
      "; everything else from: ", base.source()));
  return hw;
}

}  // namespace loom::plan
