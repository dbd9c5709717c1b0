#include "core/cuda/device_probe.h"

#include "gtest/gtest.h"

namespace loom::core::cuda {
namespace {

TEST(DeviceProbeTest, WithoutGpuTheErrorIsClear) {
  absl::StatusOr<int> count = DeviceCount();
  if (count.ok()) GTEST_SKIP() << "a GPU is present (" << *count << " devices)";
  EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(count.status().message().find("CUDA"), std::string::npos);
  // Every entry point reports the same, rather than crashing.
  EXPECT_EQ(FillIota(4, 1.0f).status().code(), absl::StatusCode::kUnavailable);
}

TEST(DeviceProbeTest, KernelRunsOnGpu) {
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) GTEST_SKIP() << "needs a GPU: " << count.status().message();
  absl::StatusOr<std::vector<float>> out = FillIota(1000, 2.5f);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ((*out)[i], 2.5f + i) << i;
}

}  // namespace
}  // namespace loom::core::cuda
