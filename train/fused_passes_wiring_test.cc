// The "adamw" and "cross_entropy" kernel choices (core/ops/kernel_manifest)
// through the trainer: forced by LOOM_KERNEL_IMPL, the runs go through the
// fused ops (counted through a wrapped kernel table) and give the unfused
// runs' losses:
//   adamw=fused_copy: AdamWStepWithCopy writes the bf16 compute copy with the
//     update. Bitwise: on the CPU (--bf16, Param::gemm_value) for one rank,
//     ZeRO-1 shards over DP 2, and TP 2 + SP with ZeRO-1; on the fake CUDA
//     device (//core/ops:fake_device: the device path, CPU kernels doing the
//     math) at the optimizer with the GPU's bf16 Param::value layout, ragged
//     parameters, slot padding and an owned range cutting parameters (a
//     ZeRO-1 shard). In f32 there is no copy and the unfused update runs.
//   cross_entropy=online: bitwise at TP 1 (CPU and fake device); under TP 2
//     the sums of exponentials differ by the rescaling's rounding (<= 4e-6
//     relative, layers/vocab_parallel_online_test), and the loss curve stays
//     within kOnlineTp2Tol of the unfused one.

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/cpu_features.h"
#include "core/ops/kernel_choice.h"
#include "core/ops/kernel_table.h"
#include "core/ops/ops.h"
#include "core/ops/testing/fake_device.h"
#include "gtest/gtest.h"
#include "layers/params.h"
#include "train/optimizer.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using core::Tensor;
using testing::Layout;

// Relative gap allowed between the online and unfused TP 2 loss curves: the
// per-row sums differ by a few 1e-7 (relative) and training carries that on.
constexpr double kOnlineTp2Tol = 1e-5;

// ---- counting the fused ops' calls through a device's table

std::atomic<long> g_fused_adamw{0}, g_online_ce{0};
const core::ops::KernelTable* g_inner = nullptr;

absl::Status CountAdamW(Tensor* p, const Tensor& g, Tensor* m, Tensor* v, int64_t step,
                        const core::ops::AdamWOptions& o, Tensor* copy) {
  ++g_fused_adamw;
  return g_inner->adamw_step_with_copy(p, g, m, v, step, o, copy);
}
absl::Status CountOnlineCe(const Tensor& l, const Tensor& t, const core::ops::VocabShard& s,
                           Tensor* max, Tensor* sums) {
  ++g_online_ce;
  return g_inner->vocab_shard_row_max_sum_exp(l, t, s, max, sums);
}

// Wraps `device`'s current table (the CPU's, or the fake device's) while alive.
class ScopedCounting {
 public:
  explicit ScopedCounting(core::Device device) : type_(device.type) {
    g_inner = *core::ops::KernelsFor(device);
    table_ = *g_inner;
    table_.adamw_step_with_copy = &CountAdamW;
    table_.vocab_shard_row_max_sum_exp = &CountOnlineCe;
    previous_ = core::ops::RegisterKernelTable(type_, &table_);
    g_fused_adamw = 0;
    g_online_ce = 0;
  }
  ~ScopedCounting() { core::ops::RegisterKernelTable(type_, previous_); }

 private:
  core::DeviceType type_;
  core::ops::KernelTable table_;
  const core::ops::KernelTable* previous_;
};

// LOOM_KERNEL_IMPL for the scope ("" : the manifest's defaults, the references).
class ScopedImpl {
 public:
  explicit ScopedImpl(const std::string& impl) {
    if (impl.empty()) {
      unsetenv("LOOM_KERNEL_IMPL");
    } else {
      setenv("LOOM_KERNEL_IMPL", impl.c_str(), 1);
    }
    core::ops::ForgetKernelChoicesForTesting();
  }
  ~ScopedImpl() {
    unsetenv("LOOM_KERNEL_IMPL");
    core::ops::ForgetKernelChoicesForTesting();
  }
};

struct Counted {
  testing::RunResult run;
  long fused_adamw, online_ce;
};

Counted RunWith(const std::string& impl, const TrainConfig& config, const Layout& layout) {
  ScopedImpl forced(impl);
  ScopedCounting counting(config.device == DeviceKind::kCuda ? core::Device::CUDA(0)
                                                             : core::Device::CPU());
  testing::RunResult r = testing::Run(config, layout);
  return Counted{r, g_fused_adamw.load(), g_online_ce.load()};
}

void ExpectSameLosses(const std::vector<double>& got, const std::vector<double>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << what << ", iteration " << i + 1;
}

TEST(FusedPassesWiringTest, FusedCopyAdamWInCpuBf16GivesTheUnfusedLossesBitwise) {
  if (!core::cpu::CheckBf16GemmSupport("--bf16").ok()) {
    GTEST_SKIP() << core::cpu::CheckBf16GemmSupport("--bf16 on --device=cpu");
  }
  constexpr int kIters = 4;
  // One rank; ZeRO-1 over DP 2 (owned shards cut parameters); TP 2 + SP with ZeRO-1.
  for (const Layout& l : {Layout{1, 1, 1}, Layout{1, 1, 2, 0, false, true},
                          Layout{2, 1, 2, 0, true, true}}) {
    TrainConfig c = testing::TinyConfig(l, kIters);
    c.bf16 = true;
    const Counted unfused = RunWith("", c, l);
    ASSERT_TRUE(unfused.run.status.ok()) << l.Describe() << ": " << unfused.run.status;
    EXPECT_EQ(unfused.fused_adamw, 0) << "the CPU's default is the reference";
    const Counted fused = RunWith("adamw=fused_copy", c, l);
    ASSERT_TRUE(fused.run.status.ok()) << l.Describe() << ": " << fused.run.status;
    EXPECT_GT(fused.fused_adamw, 0) << l.Describe() << ": AdamWStepWithCopy must have run";
    ExpectSameLosses(fused.run.losses, unfused.run.losses, "bf16 " + l.Describe());
  }
}

// f32 and both choices forced, on the CPU and on the fake device: no compute
// copy, so the unfused update runs; the online cross-entropy at TP 1 gives
// the unfused bits. Each device against its own unfused run.
TEST(FusedPassesWiringTest, F32Tp1RunsGiveTheUnfusedLossesBitwiseOnCpuAndFakeDevice) {
  constexpr int kIters = 4;
  const Layout one{1, 1, 1};
  for (const bool device : {false, true}) {
    for (const bool llama : {false, true}) {
      std::unique_ptr<core::ops::testing::ScopedFakeDevice> fake;
      if (device) fake = std::make_unique<core::ops::testing::ScopedFakeDevice>();
      TrainConfig c = llama ? testing::TinyLlamaConfig(one, kIters) : testing::TinyConfig(one, kIters);
      if (device) c.device = DeviceKind::kCuda;
      const std::string what = std::string(device ? "fake cuda" : "cpu") + (llama ? " llama" : " gpt");
      const Counted unfused = RunWith("", c, one);
      ASSERT_TRUE(unfused.run.status.ok()) << what << ": " << unfused.run.status;
      EXPECT_EQ(unfused.online_ce, 0) << what;
      const Counted forced = RunWith("adamw=fused_copy,cross_entropy=online", c, one);
      ASSERT_TRUE(forced.run.status.ok()) << what << ": " << forced.run.status;
      EXPECT_GT(forced.online_ce, 0) << what << ": the online cross-entropy must have run";
      EXPECT_EQ(forced.fused_adamw, 0) << what << ": f32 has no compute copy to write";
      ExpectSameLosses(forced.run.losses, unfused.run.losses, what);
    }
  }
}

TEST(FusedPassesWiringTest, OnlineCrossEntropyUnderTp2StaysWithinTheBound) {
  constexpr int kIters = 6;
  for (const Layout& l : {Layout{2, 1, 1}, Layout{2, 1, 1, 0, true}}) {
    const TrainConfig c = testing::TinyConfig(l, kIters);
    const Counted unfused = RunWith("", c, l);
    ASSERT_TRUE(unfused.run.status.ok()) << l.Describe() << ": " << unfused.run.status;
    const Counted online = RunWith("cross_entropy=online", c, l);
    ASSERT_TRUE(online.run.status.ok()) << l.Describe() << ": " << online.run.status;
    EXPECT_GT(online.online_ce, 0) << l.Describe();
    testing::ExpectSameCurve(online.run.losses, unfused.run.losses, 0, kOnlineTp2Tol,
                             "online cross-entropy " + l.Describe());
    double gap = 0;
    for (size_t i = 0; i < online.run.losses.size() && i < unfused.run.losses.size(); ++i) {
      gap = std::max(gap, std::abs(online.run.losses[i] - unfused.run.losses[i]) /
                              std::abs(unfused.run.losses[i]));
    }
    std::printf("%s: online vs unfused cross-entropy, max relative loss gap %.2e over %d steps "
                "(bound %.0e)\n",
                l.Describe().c_str(), gap, kIters, kOnlineTp2Tol);
  }
}

// ---- the optimizer on the fake device, with the GPU's bf16 layout
// (Param::value is the compute copy), ragged parameters, slot padding and an
// owned range that cuts parameters (a ZeRO-1 shard).

std::vector<layers::ParamSpec> RaggedSpecs() {
  std::vector<layers::ParamSpec> specs(4);
  specs[0].name = "a.weight";
  specs[0].global_shape = core::Shape{7, 5};
  specs[1].name = "a.bias";
  specs[1].global_shape = core::Shape{13};
  specs[1].weight_decay = false;
  specs[2].name = "b.weight";
  specs[2].global_shape = core::Shape{3, 3};
  specs[3].name = "b.norm";
  specs[3].global_shape = core::Shape{6};
  specs[3].init = layers::Init::kOnes;
  specs[3].weight_decay = false;
  return specs;
}

struct Snapshot {
  std::vector<float> values;
  std::vector<uint16_t> copy;
};

// Two steps over `owned` with the choice in force; the flat values and the
// whole compute copy afterwards (outside `owned` untouched by design).
Snapshot StepOnFakeDevice(const std::vector<FlatRange>& owned) {
  const core::Device dev = core::Device::CUDA(0);
  auto buf = layers::ParamBuffer::Create(RaggedSpecs(), 0, 1, 5, /*multiple=*/4, dev,
                                         core::DType::kBF16);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return {};
  // The GPU's bf16 mode: the layers multiply with the compute copy.
  EXPECT_EQ(buf->params()[0].value.dtype(), core::DType::kBF16);
  auto opt = Optimizer::Create(&*buf, OptimizerConfig{}, OptimizerGroups{}, owned);
  EXPECT_TRUE(opt.ok()) << opt.status();
  if (!opt.ok()) return {};
  const int64_t n = buf->padded_numel();
  for (int step = 1; step <= 2; ++step) {
    Tensor g = *Tensor::Zeros(core::Shape{n}, core::DType::kF32);
    for (const layers::Param& p : buf->params()) {  // padding keeps a zero gradient
      for (int64_t i = 0; i < p.grad.numel(); ++i) {
        g.data<float>()[p.offset + i] = std::sin(0.37f * static_cast<float>(p.offset + i) + step);
      }
    }
    Tensor grads = buf->flat_grads();
    EXPECT_TRUE(core::ops::Copy(g, &grads).ok());
    auto norm = (*opt)->Step(1e-2f);
    EXPECT_TRUE(norm.ok()) << norm.status();
  }
  Snapshot s;
  const Tensor values = *buf->flat_values().To(core::Device::CPU());
  const Tensor copy = *buf->flat_compute().To(core::Device::CPU());
  s.values.assign(values.data<float>(), values.data<float>() + n);
  const auto* bits = static_cast<const uint16_t*>(copy.raw_data());
  s.copy.assign(bits, bits + n);
  return s;
}

TEST(FusedPassesWiringTest, FusedCopyOptimizerOnTheFakeDeviceWritesTheSameCopyBitwise) {
  core::ops::testing::ScopedFakeDevice fake;
  // The whole buffer; a ZeRO-1-like shard cutting parameters; two ranges.
  for (const std::vector<FlatRange>& owned :
       {std::vector<FlatRange>{}, std::vector<FlatRange>{{5, 41}},
        std::vector<FlatRange>{{0, 9}, {30, 60}}}) {
    Snapshot unfused, fused;
    long calls = 0;
    {
      ScopedImpl reference("");
      ScopedCounting counting(core::Device::CUDA(0));
      unfused = StepOnFakeDevice(owned);
      EXPECT_EQ(g_fused_adamw.load(), 0);
    }
    {
      ScopedImpl forced("adamw=fused_copy");
      ScopedCounting counting(core::Device::CUDA(0));
      fused = StepOnFakeDevice(owned);
      calls = g_fused_adamw.load();
    }
    const std::string what = owned.empty() ? "whole buffer" : "owned from " + std::to_string(owned[0].first);
    EXPECT_GT(calls, 0) << what;
    ASSERT_FALSE(unfused.values.empty()) << what;
    EXPECT_EQ(fused.values, unfused.values) << what;
    EXPECT_EQ(fused.copy, unfused.copy) << what;
  }
}

}  // namespace
}  // namespace loom::train
