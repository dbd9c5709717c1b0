#include "core/ops/testing/fake_device.h"

#include <csignal>
#include <cstring>

#include "core/cpu/test_util.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"

namespace loom::core::ops::testing {
namespace {

using cpu::testing::Random;

TEST(FakeDeviceTest, KernelsOnTheDeviceMatchTheCpuBitForBit) {
  ScopedFakeDevice device;
  const Tensor a = Random(Shape{5, 7}, 1), b = Random(Shape{7, 3}, 2);
  Tensor want = *Tensor::Empty(Shape{5, 3}, DType::kF32);
  ASSERT_TRUE(Matmul(a, b, &want).ok());

  const long calls = ScopedFakeDevice::kernel_calls();
  Tensor da = *a.To(Device::CUDA(0)), db = *b.To(Device::CUDA(0));
  Tensor dc = *Tensor::Empty(Shape{5, 3}, DType::kF32, Device::CUDA(0));
  ASSERT_TRUE(Matmul(da, db, &dc).ok());
  EXPECT_EQ(ScopedFakeDevice::kernel_calls(), calls + 1);
  Tensor got = *dc.To(Device::CPU());
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0);
}

TEST(FakeDeviceTest, HostAccessToDeviceMemoryCrashes) {
  ScopedFakeDevice device;
  Tensor t = *Tensor::Empty(Shape{4}, DType::kF32, Device::CUDA(0));
  // The address is non-canonical: reading it from the host faults, which is
  // what catches host code touching device tensors.
  EXPECT_DEATH({ volatile float x = t.data<float>()[0]; (void)x; }, "");
}

}  // namespace
}  // namespace loom::core::ops::testing
