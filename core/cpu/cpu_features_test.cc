#include "core/cpu/cpu_features.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::core::cpu {
namespace {

TEST(CpuFeaturesTest, ReportsAModelName) {
  EXPECT_FALSE(HostCpuFeatures().model.empty());
}

TEST(CpuFeaturesTest, Bf16ImpliesAvx512) {
  const CpuFeatures& f = HostCpuFeatures();
  if (f.avx512_bf16) {
    EXPECT_TRUE(f.avx512f);
  }
}

TEST(CpuFeaturesTest, CheckAgreesWithTheFeatures) {
  const CpuFeatures& f = HostCpuFeatures();
  const absl::Status st = CheckBf16GemmSupport("--bf16 on --device=cpu");
  EXPECT_EQ(st.ok(), f.avx512_bf16 || f.amx_bf16) << st;
}

// The error every machine can produce: names the flag, both instruction sets
// and the CPU model.
TEST(CpuFeaturesTest, HiddenBf16GivesAClearError) {
  HideBf16ForTesting(true);
  const absl::Status st = CheckBf16GemmSupport("--bf16 on --device=cpu");
  HideBf16ForTesting(false);
  ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  const std::string msg(st.message());
  EXPECT_NE(msg.find("--bf16 on --device=cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("AVX512_BF16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("AMX-BF16"), std::string::npos) << msg;
  EXPECT_NE(msg.find(HostCpuFeatures().model), std::string::npos) << msg;
}

}  // namespace
}  // namespace loom::core::cpu
