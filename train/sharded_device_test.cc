// Data parallelism on --device=cuda without a GPU: every rank trains on the
// fake device of //core/ops:fake_device (device memory behind poisoned
// pointers: a host access crashes) and its collectives move device memory
// through //comm/testing:host_staged, as NCCL's would. Each layout, under
// each sharding strategy (no_shard, ZeRO-1, -2, -3) with and without the
// overlaps, must reproduce the same layout's CPU run bit for bit (the kernels
// are the CPU's): the losses and the final gradient norm. That proves the
// device path of the gradient buckets, the shards, the ZeRO-3 gathers and the
// optimizer; NCCL's streams are a GPU run's to prove (docs/DEVICE_CHECK.md).

#include <cstdlib>
#include <string>
#include <vector>

#include "core/cpu/cpu_features.h"
#include "core/ops/testing/fake_device.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using core::ops::testing::ScopedFakeDevice;
using testing::Layout;
using testing::OptimGrads;
using testing::OptimGradsParams;

constexpr int kIters = 4;

// Bit for bit needs the CPU's attention on the device too (the device's
// default is the kernel manifest's; //train:device_plumbing_test).
const bool kSameAttentionAsTheCpu = [] {
  setenv("LOOM_KERNEL_IMPL", "attention=flash", 1);
  return true;
}();

Layout Dist(Layout l) {  // ZeRO-1: --use-distributed-optimizer
  l.distributed = true;
  return l;
}
Layout Overlapped(Layout l, bool param_gather) {
  l.overlap = true;
  l.param_gather = param_gather;
  return l;
}

TrainConfig Config(const Layout& l, bool llama, int iters = kIters) {
  return llama ? testing::TinyLlamaConfig(l, iters) : testing::TinyConfig(l, iters);
}

// `config` (a layout's) on the CPU and on the fake device: equal losses and
// final gradient norm, and the device run's kernels went through the device
// table.
void ExpectDeviceRunIsTheCpuRun(const TrainConfig& config, const Layout& l,
                                const std::string& what) {
  ASSERT_TRUE(kSameAttentionAsTheCpu);
  const testing::Curve cpu = testing::TrainCurve(config, l);
  ASSERT_EQ(cpu.losses.size(), static_cast<size_t>(config.train_iters)) << what;

  ScopedFakeDevice device;
  TrainConfig c = config;
  c.device = DeviceKind::kCuda;
  const long calls = ScopedFakeDevice::kernel_calls();
  const testing::Curve gpu = testing::TrainCurve(c, l);
  EXPECT_GT(ScopedFakeDevice::kernel_calls(), calls + 100 * l.world())
      << what << ": the kernels must have run through the device table";
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size()) << what;
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_EQ(gpu.losses[i], cpu.losses[i]) << what << ", iteration " << i + 1;
  }
  EXPECT_GT(cpu.grad_norm, 0) << what;
  EXPECT_EQ(gpu.grad_norm, cpu.grad_norm) << what;
}

void ExpectDeviceRunIsTheCpuRun(const Layout& l, bool llama) {
  ExpectDeviceRunIsTheCpuRun(Config(l, llama), l, (llama ? "Llama-style " : "GPT-2 ") + l.Describe());
}

const Layout kDp2{1, 1, 2};

TEST(ShardedDeviceTest, NoShard) {
  ExpectDeviceRunIsTheCpuRun(kDp2, false);
  ExpectDeviceRunIsTheCpuRun(Overlapped(kDp2, false), false);
}

TEST(ShardedDeviceTest, OptimZero1) {
  ExpectDeviceRunIsTheCpuRun(Dist(kDp2), false);
  ExpectDeviceRunIsTheCpuRun(Overlapped(Dist(kDp2), true), false);
}

TEST(ShardedDeviceTest, OptimGradsZero2) {
  ExpectDeviceRunIsTheCpuRun(OptimGrads(kDp2), false);
  ExpectDeviceRunIsTheCpuRun(Overlapped(OptimGrads(kDp2), false), false);
}

TEST(ShardedDeviceTest, OptimGradsParamsZero3) {
  ExpectDeviceRunIsTheCpuRun(OptimGradsParams(kDp2), false);
  ExpectDeviceRunIsTheCpuRun(Overlapped(OptimGradsParams(kDp2), true), false);
}

// TP 2 (with SP) x DP 2 and PP 2 x DP 2 (the tied embedding summed over the
// end stages) under ZeRO-2 and ZeRO-3.
TEST(ShardedDeviceTest, TensorAndPipelineParallelUnderZero2AndZero3) {
  const Layout tp2_dp2{2, 1, 2, 0, true};
  const Layout pp2_dp2{1, 2, 2};
  ExpectDeviceRunIsTheCpuRun(OptimGrads(tp2_dp2), false);
  ExpectDeviceRunIsTheCpuRun(Overlapped(OptimGradsParams(tp2_dp2), true), false);
  ExpectDeviceRunIsTheCpuRun(Overlapped(OptimGrads(pp2_dp2), false), false);
  ExpectDeviceRunIsTheCpuRun(Overlapped(OptimGradsParams(pp2_dp2), true), false);
}

// RMSNorm, RoPE, SwiGLU, GQA and the untied output layer.
TEST(ShardedDeviceTest, LlamaStyle) {
  ExpectDeviceRunIsTheCpuRun(Overlapped(OptimGrads(kDp2), false), true);
  ExpectDeviceRunIsTheCpuRun(Overlapped(OptimGradsParams(kDp2), true), true);
  ExpectDeviceRunIsTheCpuRun(OptimGradsParams({2, 1, 2, 0, true}), true);
  ExpectDeviceRunIsTheCpuRun(OptimGrads({1, 2, 2}), true);
}

// ZeRO-3's other paths: the interleaved schedule, a recomputed forward's
// second gather, hybrid sharding's replica all-reduce. (Context parallelism
// and experts run on the CPU only: Finalize refuses them on a device.)
TEST(ShardedDeviceTest, MoreZero3Paths) {
  Layout interleaved = Overlapped(OptimGradsParams({1, 2, 2, 1}), true);
  interleaved.schedule = "interleaved";
  ExpectDeviceRunIsTheCpuRun(interleaved, false);

  const Layout dp2 = Overlapped(OptimGradsParams(kDp2), true);
  TrainConfig recompute = Config(dp2, false);
  recompute.model.recompute_granularity = layers::RecomputeGranularity::kFull;
  recompute.model.recompute_method = layers::RecomputeMethod::kUniform;
  recompute.model.recompute_num_layers = 1;
  ExpectDeviceRunIsTheCpuRun(recompute, dp2, "GPT-2 " + dp2.Describe() + " recompute full");

  for (const Layout& l : {Overlapped(OptimGrads({1, 1, 4}), false),
                          Overlapped(OptimGradsParams({1, 1, 4}), true)}) {
    TrainConfig hybrid = Config(l, false);
    hybrid.num_distributed_optimizer_instances = 2;
    ExpectDeviceRunIsTheCpuRun(hybrid, l, "GPT-2 " + l.Describe() + " 2 instances");
  }
}

// --bf16: each ZeRO-3 gather converts the unit's f32 values into the bf16
// copy the GEMMs read, on the device. The fake device runs the CPU's bf16
// GEMMs, so it needs a CPU that has them.
TEST(ShardedDeviceTest, Bf16UnderZero2AndZero3) {
  if (absl::Status s = core::cpu::CheckBf16GemmSupport("--bf16"); !s.ok()) {
    GTEST_SKIP() << "no bf16 GEMMs on this CPU: " << s;
  }
  for (const Layout& l : {Overlapped(OptimGrads(kDp2), false),
                          Overlapped(OptimGradsParams(kDp2), true),
                          OptimGradsParams({2, 1, 2, 0, true})}) {
    TrainConfig c = Config(l, true);
    c.bf16 = true;
    ExpectDeviceRunIsTheCpuRun(c, l, "bf16 Llama-style " + l.Describe());
  }
}

// The trainer's own collectives beside the gradients' (the loss average,
// evaluation, the memory report, the timers' and the straggler's min/max,
// the profiler's merge) move device memory on a device communicator: a
// logged, evaluated, profiled ZeRO-3 run on the device is the CPU's.
TEST(ShardedDeviceTest, LoggingEvaluationAndReportsOnTheDevice) {
  const Layout l = Overlapped(OptimGradsParams({2, 1, 2, 0, true}), true);
  auto make = [&](const std::string& profile_dir) {
    TrainConfig c = Config(l, false);
    c.log_interval = 1;
    c.eval_interval = 2;
    c.eval_iters = 1;
    c.memory_report = true;
    c.timing_log_level = 2;
    c.log_straggler = true;
    c.profile = true;
    c.profile_dir = std::string(getenv("TEST_TMPDIR")) + "/" + profile_dir;
    c.profile_step_start = 1;
    c.profile_step_end = 3;
    return c;
  };
  testing::RunResult cpu = testing::Run(make("profile_cpu"), l);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ScopedFakeDevice device;
  TrainConfig c = make("profile_device");
  c.device = DeviceKind::kCuda;
  testing::RunResult gpu = testing::Run(c, l);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  EXPECT_EQ(gpu.losses, cpu.losses);
  EXPECT_EQ(gpu.eval_loss, cpu.eval_loss);
  auto has = [](const testing::RunResult& r, const std::string& text) {
    for (const std::string& line : r.log) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  for (const char* text : {"memory (rank 3", "straggler", "validation loss", "host-staged"}) {
    EXPECT_TRUE(has(gpu, text)) << "the device run logs no \"" << text << "\"";
  }
}

// Runs `save_layout` for kRun steps saving at kSaveAt, then resumes that
// checkpoint under `load_layout`; `save_on_device` / `load_on_device` put the
// halves on the fake device. Both runs' losses.
struct SavedAndResumed {
  std::vector<double> saved, resumed;
};
constexpr int kRun = 6, kSaveAt = 3;
SavedAndResumed SaveThenResume(const Layout& save_layout, bool save_on_device,
                               const Layout& load_layout, bool load_on_device,
                               const std::string& name) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  // Same flags in both halves (the LR schedule depends on --train-iters).
  TrainConfig save = Config(save_layout, false, kRun);
  save.save = dir;
  save.save_interval = kSaveAt;
  TrainConfig load = Config(load_layout, false, kRun);
  load.load = dir;
  load.checkpoint.load_iteration = kSaveAt;
  ScopedFakeDevice device;
  if (save_on_device) save.device = DeviceKind::kCuda;
  if (load_on_device) load.device = DeviceKind::kCuda;
  SavedAndResumed out;
  testing::RunResult a = testing::Run(save, save_layout);
  EXPECT_TRUE(a.status.ok()) << name << ": " << a.status;
  testing::RunResult b = testing::Run(load, load_layout);
  EXPECT_TRUE(b.status.ok()) << name << ": " << b.status;
  EXPECT_EQ(b.losses.size(), static_cast<size_t>(kRun - kSaveAt)) << name;
  return {a.losses, b.losses};
}

// A checkpoint saved by a ZeRO-3 run on the device (staged through a host
// mirror of each rank's owned values and moments) loads on the CPU under
// ZeRO-1 and continues exactly as the one the same run saved on the CPU; and
// a ZeRO-1 CPU checkpoint resumes under ZeRO-3 on the device exactly as on
// the CPU.
TEST(ShardedDeviceTest, Zero3CheckpointsMoveBetweenDeviceAndCpu) {
  const Layout zero3 = Overlapped(OptimGradsParams(kDp2), true);
  const Layout zero1 = Dist(kDp2);
  const SavedAndResumed cpu = SaveThenResume(zero3, false, zero1, false, "zero3_cpu");
  const SavedAndResumed gpu = SaveThenResume(zero3, true, zero1, false, "zero3_device");
  EXPECT_EQ(gpu.saved, cpu.saved) << "the ZeRO-3 run that saved";
  EXPECT_EQ(gpu.resumed, cpu.resumed) << "the CPU's ZeRO-1 steps after the device's checkpoint";

  const SavedAndResumed cpu_back = SaveThenResume(zero1, false, zero3, false, "zero1_cpu");
  const SavedAndResumed gpu_back = SaveThenResume(zero1, false, zero3, true, "zero1_to_device");
  EXPECT_EQ(gpu_back.resumed, cpu_back.resumed) << "ZeRO-3 on the device after a CPU checkpoint";
}

}  // namespace
}  // namespace loom::train
