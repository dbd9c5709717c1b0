#include "plan/hardware.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::plan {
namespace {

TEST(HardwareTest, CommittedFilesParse) {
  for (const char* name : {"cpu", "h100_dgx", "a100_dgx"}) {
    absl::StatusOr<Hardware> hw = LoadHardware(std::string("plan/testdata/") + name + ".textproto");
    ASSERT_TRUE(hw.ok()) << name << ": " << hw.status();
    EXPECT_GT(hw->peak_flops(), 0) << name;
    EXPECT_GT(hw->gemm_efficiency_size(), 2) << name;
  }
  absl::StatusOr<Hardware> h100 = LoadHardware("plan/testdata/h100_dgx.textproto");
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->peak_flops(), 989e12);  // the datasheet's dense BF16
  absl::StatusOr<Hardware> a100 = LoadHardware("plan/testdata/a100_dgx.textproto");
  ASSERT_TRUE(a100.ok());
  EXPECT_EQ(a100->peak_flops(), 312e12);
}

TEST(HardwareTest, ErrorsNameTheFileAndField) {
  absl::StatusOr<Hardware> bad = ParseHardware("peak_flops: 1e12\nbogus: 3\n", "x.textproto");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--hardware=x.textproto"), std::string::npos);
  EXPECT_NE(bad.status().message().find("bogus"), std::string::npos) << bad.status();
  absl::StatusOr<Hardware> missing = ParseHardware("peak_flops: 1e12\n", "y.textproto");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("device_memory_bytes"), std::string::npos);
}

TEST(HardwareTest, MeasuredRatesMustBePositiveWhenGiven) {
  const std::string base =
      "device_memory_bytes: 1e9 peak_flops: 1e12 memory_bandwidth: 1e11 devices_per_node: 1 "
      "intra_node { all_reduce { bus_bandwidth: 1e10 } } "
      "inter_node { all_reduce { bus_bandwidth: 1e10 } } ";
  absl::StatusOr<Hardware> bad = ParseHardware(base + "elementwise_bandwidth: -1", "z.textproto");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--hardware=z.textproto: elementwise_bandwidth"),
            std::string::npos)
      << bad.status();
  bad = ParseHardware(base + "attention_curve { flops: 1e6 efficiency: 1.5 }", "z.textproto");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("attention_curve"), std::string::npos) << bad.status();
}

TEST(HardwareTest, MeasuredRatesReplaceTheirFallbacks) {
  const std::string base =
      "device_memory_bytes: 1e9 peak_flops: 1e12 memory_bandwidth: 1e11 devices_per_node: 2 "
      "ranks_share_compute: true attention_efficiency: 0.5 "
      "gemm_efficiency { flops: 1 efficiency: 0.8 } "
      "intra_node { all_reduce { bus_bandwidth: 1e10 } } "
      "inter_node { all_reduce { bus_bandwidth: 1e10 } } ";
  absl::StatusOr<Hardware> plain = ParseHardware(base, "plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_DOUBLE_EQ(ElementwiseSeconds(*plain, 1e9), 1e-2);
  EXPECT_DOUBLE_EQ(OptimizerSeconds(*plain, 1e9, 2), 2e-2);  // two ranks share the socket
  EXPECT_DOUBLE_EQ(AttentionSeconds(*plain, 1e9), 1e9 / (1e12 * 0.8 * 0.5));
  EXPECT_DOUBLE_EQ(AttentionBackwardRatio(*plain), 2.5);
  absl::StatusOr<Hardware> measured = ParseHardware(
      base + "elementwise_bandwidth: 2e10 optimizer_bandwidth: 4e10 attention_backward_ratio: 2 "
             "attention_curve { flops: 1e8 efficiency: 0.1 } "
             "attention_curve { flops: 1e10 efficiency: 0.3 }",
      "measured");
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_DOUBLE_EQ(ElementwiseSeconds(*measured, 1e9), 5e-2);
  EXPECT_DOUBLE_EQ(OptimizerSeconds(*measured, 1e9, 2), 5e-2);
  EXPECT_NEAR(AttentionSeconds(*measured, 1e9), 1e9 / (1e12 * 0.2), 1e-15);  // log-midpoint
  EXPECT_DOUBLE_EQ(AttentionSeconds(*measured, 1e6), 1e6 / (1e12 * 0.1));    // clamped
  EXPECT_DOUBLE_EQ(AttentionBackwardRatio(*measured), 2);
}

Hardware Simple() {
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    device_memory_bytes: 1e9 peak_flops: 1e12 memory_bandwidth: 1e11 devices_per_node: 4
    gemm_efficiency { flops: 1e6 efficiency: 0.2 }
    gemm_efficiency { flops: 1e8 efficiency: 0.8 }
    intra_node { all_reduce { bus_bandwidth: 1e10 latency: 1e-5 } }
    inter_node { all_reduce { bus_bandwidth: 1e9 latency: 1e-4 }
                 all_gather { bus_bandwidth: 2e9 latency: 2e-4 } }
  )", "simple");
  EXPECT_TRUE(hw.ok()) << hw.status();
  return *hw;
}

TEST(HardwareTest, EfficiencyInterpolatesInLogFlopsAndClamps) {
  const Hardware hw = Simple();
  EXPECT_DOUBLE_EQ(GemmEfficiency(hw, 1e3), 0.2);
  EXPECT_DOUBLE_EQ(GemmEfficiency(hw, 1e10), 0.8);
  EXPECT_NEAR(GemmEfficiency(hw, 1e7), 0.5, 1e-12);
  // 2·100·100·50 = 1e6 FLOPs at 20% of 1e12.
  EXPECT_NEAR(GemmSeconds(hw, 100, 100, 50), 1e6 / 0.2e12, 1e-15);
}

TEST(HardwareTest, CollectivesFollowTheRingFormulas) {
  const Hardware hw = Simple();
  EXPECT_EQ(CollectiveSeconds(hw, CollectiveKind::kAllReduce, 1e6, 1, false), 0);
  // all-reduce over 4: latency + 2·3/4 · bytes / busbw.
  EXPECT_NEAR(CollectiveSeconds(hw, CollectiveKind::kAllReduce, 1e6, 4, false),
              1e-5 + 1.5 * 1e6 / 1e10, 1e-15);
  // all-gather falls back to all-reduce's link intra-node, has its own inter-node.
  EXPECT_NEAR(CollectiveSeconds(hw, CollectiveKind::kAllGather, 1e6, 4, false),
              1e-5 + 0.75 * 1e6 / 1e10, 1e-15);
  EXPECT_NEAR(CollectiveSeconds(hw, CollectiveKind::kAllGather, 1e6, 4, true),
              2e-4 + 0.75 * 1e6 / 2e9, 1e-15);
}

TEST(HardwareTest, RingStepsAddLatencyAndNodesAddNics) {
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    device_memory_bytes: 1e9 peak_flops: 1e12 memory_bandwidth: 1e11 devices_per_node: 8
    intra_node { all_reduce { bus_bandwidth: 3e11 latency: 8e-6 step_latency: 3e-6 } }
    inter_node { all_reduce { bus_bandwidth: 4e10 latency: 8e-6 step_latency: 1e-5 } }
  )", "steps");
  ASSERT_TRUE(hw.ok()) << hw.status();
  // Intra-node reduce-scatter over 8: base + 7 NVLink steps.
  EXPECT_NEAR(CollectiveSeconds(*hw, CollectiveKind::kReduceScatter, 1e6, 8, false),
              8e-6 + 7 * 3e-6 + 7.0 / 8 * 1e6 / 3e11, 1e-15);
  // 48 ranks, one per node: 47 network steps, one NIC.
  EXPECT_NEAR(CollectiveSeconds(*hw, CollectiveKind::kReduceScatter, 1e6, 48, true),
              8e-6 + 47 * 1e-5 + 47.0 / 48 * 1e6 / 4e10, 1e-15);
  // 48 ranks, 8 per node: 5 network steps, 42 on NVLink; 8 NICs, capped by NVLink.
  EXPECT_NEAR(CollectiveSeconds(*hw, CollectiveKind::kReduceScatter, 1e6, 48, true, 8),
              8e-6 + 5 * 1e-5 + 42 * 3e-6 + 47.0 / 48 * 1e6 / 3e11, 1e-15);
  // 4 per node: 4 NICs; all-reduce: twice the steps.
  EXPECT_NEAR(CollectiveSeconds(*hw, CollectiveKind::kAllReduce, 1e6, 48, true, 4),
              8e-6 + 2 * (11 * 1e-5 + 36 * 3e-6) + 2 * 47.0 / 48 * 1e6 / 1.6e11, 1e-15);
  // send/recv: no ring.
  EXPECT_NEAR(CollectiveSeconds(*hw, CollectiveKind::kSendRecv, 1e6, 2, true),
              8e-6 + 1e6 / 4e10, 1e-15);
}

}  // namespace
}  // namespace loom::plan
