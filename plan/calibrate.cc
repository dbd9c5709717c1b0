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

}  // namespace

absl::StatusOr<std::string> Calibrate() {
  std::string gemm;
  double peak = 0;
  std::vector<std::pair<double, double>> points;
  for (int64_t n : {64, 128, 256, 512, 1024, 2048}) {
    auto a = core::Tensor::Zeros({n, n}, core::DType::kF32);
    auto b = core::Tensor::Zeros({n, n}, core::DType::kF32);
    auto c = core::Tensor::Zeros({n, n}, core::DType::kF32);
    if (!a.ok() || !b.ok() || !c.ok()) return absl::ResourceExhaustedError("calibrate: GEMM buffers");
    auto run = [&] { return core::ops::Matmul(*a, *b, &*c); };
    (void)run();
    const int reps = n <= 256 ? 100 : n <= 1024 ? 12 : 4;
    auto t = Best(reps, run);
    if (!t.ok()) return t.status();
    const double flops = 2.0 * n * n * n;
    points.push_back({flops, flops / *t});
    peak = std::max(peak, flops / *t);
  }
  // Load from other processes only slows a GEMM down, and a larger GEMM is
  // never less efficient on this BLAS once measured quietly (BENCHMARKS.md):
  // the curve keeps the best rate seen at or below each size.
  double best = 0;
  for (const auto& [flops, rate] : points) {
    best = std::max(best, rate);
    absl::StrAppendFormat(&gemm, "gemm_efficiency { flops: %.6g efficiency: %.3f }\n", flops,
                          std::min(1.0, best / peak));
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
      "# Measured by `bazel run //train:plan -- --calibrate` (plan/calibrate.cc): f32 GEMMs\n"
      "# through core/ops, a 64 MiB memcpy, the local backend's collectives between two\n"
      "# threads (best of 5; bus bandwidth from 4 MiB minus the 8 B latency).\n",
      absl::StrFormat("name: \"cpu-%u-cores (calibrated)\"\n", cores),
      "source: \"//train:plan --calibrate\"\n",
      absl::StrFormat("device_memory_bytes: %.6g  # the host's RAM (ranks share it)\n",
                      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE)),
      absl::StrFormat("peak_flops: %.6g\n", peak), gemm,
      absl::StrFormat("memory_bandwidth: %.6g\n", bandwidth),
      "devices_per_node: 64\nranks_share_compute: true\ncompute_dtype_bytes: 4\n",
      "attention_efficiency: 0.5\n", "intra_node {\n", link, "}\n", "inter_node {\n", link, "}\n");
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
