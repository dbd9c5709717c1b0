// The overrides of kernel_choice.h.
#include "core/ops/kernel_choice.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace loom::core::ops {
namespace {

// Each case sets the variables, then decides afresh.
class KernelChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override { ForgetKernelChoicesForTesting(); }
  void TearDown() override {
    unsetenv("LOOM_KERNEL_IMPL");
    unsetenv("LOOM_REFERENCE_KERNELS");
    ForgetKernelChoicesForTesting();
  }
};

TEST_F(KernelChoiceTest, ReferenceKernelsVariableForcesEveryReference) {
  setenv("LOOM_REFERENCE_KERNELS", "1", 1);
  auto cpu = ChooseKernel("attention", DeviceType::kCPU);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->implementation, "sxs");
  EXPECT_NE(cpu->reason.find("LOOM_REFERENCE_KERNELS"), std::string::npos);
  unsetenv("LOOM_REFERENCE_KERNELS");
}

TEST_F(KernelChoiceTest, ForcedImplementationAppliesWhereListed) {
  setenv("LOOM_KERNEL_IMPL", "attention=cudnn", 1);
  EXPECT_TRUE(CheckKernelOverrides().ok());
  auto cuda = ChooseKernel("attention", DeviceType::kCUDA);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->implementation, "cudnn");
  // The CPU lists no cudnn: the override is not for it.
  auto cpu = ChooseKernel("attention", DeviceType::kCPU);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->implementation, "flash");
  unsetenv("LOOM_KERNEL_IMPL");
}

TEST_F(KernelChoiceTest, UnknownOverrideIsRefusedNamingTheVariable) {
  setenv("LOOM_KERNEL_IMPL", "attention=fastest", 1);
  absl::Status s = CheckKernelOverrides();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("LOOM_KERNEL_IMPL=attention=fastest"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("attention=cudnn (cuda)"), absl::string_view::npos) << s;
  setenv("LOOM_KERNEL_IMPL", "attention", 1);
  s = CheckKernelOverrides();
  EXPECT_NE(s.message().find("expected op=implementation"), absl::string_view::npos) << s;
  unsetenv("LOOM_KERNEL_IMPL");
}

TEST_F(KernelChoiceTest, ImplementationsListTheReferenceFirst) {
  const auto names = KernelImplementations("attention", DeviceType::kCUDA);
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names.front(), "sxs");
}

}  // namespace
}  // namespace loom::core::ops
