// --device=cuda without a GPU: the trainer runs on the fake device of
// //core/ops:fake_device (device memory behind poisoned pointers, so any host
// access to it crashes; the CPU kernels do the math). Training there must give
// the CPU run's loss curve exactly, proving that parameters, optimizer state,
// micro-batches and the scalar results all move through the device path.
// The CUDA kernels themselves are compared with the CPU in //core/cuda tests
// on a GPU.

#include "core/ops/testing/fake_device.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;

TEST(DevicePlumbingTest, TrainingOnTheDeviceReproducesTheCpuRunExactly) {
  constexpr int kIters = 6;
  const Layout one{1, 1, 1};
  testing::RunResult cpu = testing::Run(testing::TinyConfig(one, kIters), one);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ASSERT_EQ(cpu.losses.size(), static_cast<size_t>(kIters));

  core::ops::testing::ScopedFakeDevice device;
  TrainConfig config = testing::TinyConfig(one, kIters);
  config.device = "cuda";
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

}  // namespace
}  // namespace loom::train
