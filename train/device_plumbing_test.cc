// --device=cuda without a GPU: the trainer runs on the fake device of
// //core/ops:fake_device (device memory behind poisoned pointers, so any host
// access to it crashes; the CPU kernels do the math). Training there must give
// the CPU run's loss curve exactly, proving that parameters, optimizer state,
// micro-batches and the scalar results all move through the device path.
// The CUDA kernels themselves are compared with the CPU in //core/cuda tests
// on a GPU.

#include <cmath>
#include <cstdlib>

#include "core/ops/kernel_choice.h"
#include "core/ops/testing/fake_device.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;

// These cases prove placement and dispatch bit for bit, so the device runs
// the CPU's attention (flash); which attention a device runs by default is
// the kernel manifest's (//core/ops:kernel_choice_test, and the case below).
const bool kSameAttentionAsTheCpu = [] {
  setenv("LOOM_KERNEL_IMPL", "attention=flash", 1);
  return true;
}();

void ExpectDeviceRunReproducesCpuRun(bool llama) {
  constexpr int kIters = 6;
  const Layout one{1, 1, 1};
  auto make = [&] {
    return llama ? testing::TinyLlamaConfig(one, kIters) : testing::TinyConfig(one, kIters);
  };
  testing::RunResult cpu = testing::Run(make(), one);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ASSERT_EQ(cpu.losses.size(), static_cast<size_t>(kIters));

  core::ops::testing::ScopedFakeDevice device;
  TrainConfig config = make();
  config.device = DeviceKind::kCuda;
  const long calls = core::ops::testing::ScopedFakeDevice::kernel_calls();
  testing::RunResult gpu = testing::Run(config, one);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  EXPECT_GT(core::ops::testing::ScopedFakeDevice::kernel_calls(), calls + 100)
      << "the kernels must have run through the device table";
  EXPECT_GT(core::ops::testing::ScopedFakeDevice::copied_bytes(), 0);
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_EQ(gpu.losses[i], cpu.losses[i]) << "iteration " << i + 1;
  }
}

TEST(DevicePlumbingTest, TrainingOnTheDeviceReproducesTheCpuRunExactly) {
  ASSERT_TRUE(kSameAttentionAsTheCpu);
  ExpectDeviceRunReproducesCpuRun(false);
}

// Without an override the (fake) CUDA device runs the manifest's CUDA
// attention, the s x s kernel keeping the probabilities: the same losses as
// the CPU's flash kernel up to f32 summation order.
TEST(DevicePlumbingTest, DeviceDefaultAttentionIsTheManifestsAndMatchesTheCpu) {
  constexpr int kIters = 4;
  const Layout one{1, 1, 1};
  unsetenv("LOOM_KERNEL_IMPL");
  core::ops::ForgetKernelChoicesForTesting();
  auto cuda = core::ops::ChooseKernel("attention", core::DeviceType::kCUDA);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->implementation, "sxs");
  testing::RunResult cpu = testing::Run(testing::TinyConfig(one, kIters), one);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  core::ops::testing::ScopedFakeDevice device;
  TrainConfig config = testing::TinyConfig(one, kIters);
  config.device = DeviceKind::kCuda;
  testing::RunResult gpu = testing::Run(config, one);
  setenv("LOOM_KERNEL_IMPL", "attention=flash", 1);
  core::ops::ForgetKernelChoicesForTesting();
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-5 * std::abs(cpu.losses[i])) << "iteration " << i + 1;
  }
}

// RMSNorm, RoPE, SwiGLU and the GQA row gathers (their index tensors are
// made on the host and moved to the device) through the device table.
TEST(DevicePlumbingTest, LlamaStyleTrainingOnTheDeviceReproducesTheCpuRunExactly) {
  ExpectDeviceRunReproducesCpuRun(true);
}

}  // namespace
}  // namespace loom::train

namespace loom::train {
namespace {

// Checkpoints of a device run go through host mirrors: saved on the (fake)
// device at iteration 3, resumed on the CPU, the run continues exactly as the
// uninterrupted CPU run; and the other way round.
TEST(DevicePlumbingTest, CheckpointsMoveBetweenDeviceAndCpu) {
  constexpr int kIters = 6;
  const testing::Layout one{1, 1, 1};
  testing::RunResult cpu = testing::Run(testing::TinyConfig(one, kIters), one);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  const std::string base = std::string(getenv("TEST_TMPDIR")) + "/device_ckpt";
  for (const bool save_on_device : {true, false}) {
    const std::string dir = base + (save_on_device ? "_from_device" : "_from_cpu");
    // Same flags in both runs (the LR schedule depends on --train-iters).
    TrainConfig first = testing::TinyConfig(one, kIters);
    first.save = dir;
    first.save_interval = 3;
    TrainConfig second = testing::TinyConfig(one, kIters);
    second.load = dir;
    second.checkpoint.load_iteration = 3;
    core::ops::testing::ScopedFakeDevice device;
    (save_on_device ? first : second).device = DeviceKind::kCuda;
    testing::RunResult a = testing::Run(first, one);
    ASSERT_TRUE(a.status.ok()) << a.status;
    testing::RunResult b = testing::Run(second, one);
    ASSERT_TRUE(b.status.ok()) << b.status;
    ASSERT_EQ(b.losses.size(), static_cast<size_t>(kIters - 3));
    for (int i = 0; i < kIters - 3; ++i) {
      EXPECT_EQ(b.losses[i], cpu.losses[3 + i])
          << (save_on_device ? "device -> cpu" : "cpu -> device") << ", iteration " << 4 + i;
    }
  }
}

}  // namespace
}  // namespace loom::train
