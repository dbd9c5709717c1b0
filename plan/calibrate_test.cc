// --calibrate on a device (CalibrateDevice), run here on the CPU with small
// GEMMs: the curve and the bandwidth are replaced by measurements, everything
// else is the base file's, and the result reads back as a hardware file.
// The CPU's --calibrate (Calibrate): its arithmetic, and its output parses.
#include "plan/calibrate.h"

#include <algorithm>
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace loom::plan {
namespace {

Hardware Base() {
  absl::StatusOr<Hardware> hw = ParseHardware(R"(
    name: "base" source: "datasheet" device_memory_bytes: 1e12 peak_flops: 1e15
    gemm_efficiency { flops: 1 efficiency: 0.5 }
    memory_bandwidth: 1e11 devices_per_node: 8 attention_efficiency: 0.7
    intra_node { all_reduce { bus_bandwidth: 3e11 latency: 1e-5 } }
    inter_node { all_reduce { bus_bandwidth: 4e10 latency: 3e-5 } }
  )", "base");
  EXPECT_TRUE(hw.ok()) << hw.status();
  return *hw;
}

TEST(CalibrateTest, MeasuresTheCurveAndBandwidthKeepsTheRest) {
  const Hardware base = Base();
  // Two shapes of equal FLOPs become one averaged point.
  const std::vector<GemmShape> shapes = {{16, 16, 16}, {32, 32, 32}, {64, 32, 16}, {64, 64, 64}};
  absl::StatusOr<Hardware> hw =
      CalibrateDevice(base, core::Device::CPU(), core::DType::kF32, shapes, 1 << 20);
  ASSERT_TRUE(hw.ok()) << hw.status();
  ASSERT_EQ(hw->gemm_efficiency_size(), 3);
  EXPECT_DOUBLE_EQ(hw->gemm_efficiency(0).flops(), 2.0 * 16 * 16 * 16);
  EXPECT_DOUBLE_EQ(hw->gemm_efficiency(1).flops(), 2.0 * 32 * 32 * 32);
  EXPECT_DOUBLE_EQ(hw->gemm_efficiency(2).flops(), 2.0 * 64 * 64 * 64);
  for (const GemmPoint& p : hw->gemm_efficiency()) {
    EXPECT_GT(p.efficiency(), 0);
    EXPECT_LE(p.efficiency(), 1);
  }
  EXPECT_GT(hw->memory_bandwidth(), 0);
  EXPECT_NE(hw->memory_bandwidth(), base.memory_bandwidth());
  EXPECT_EQ(hw->peak_flops(), base.peak_flops());
  EXPECT_EQ(hw->inter_node().all_reduce().bus_bandwidth(), 4e10);
  EXPECT_EQ(hw->attention_efficiency(), 0.7);
  EXPECT_NE(hw->source().find("measured by //train:plan --calibrate on cpu"), std::string::npos)
      << hw->source();
  EXPECT_NE(hw->source().find("datasheet"), std::string::npos) << hw->source();
  std::string text;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(*hw, &text));
  absl::StatusOr<Hardware> back = ParseHardware(text, "calibrated");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->gemm_efficiency_size(), 3);
}

TEST(CalibrateTest, NeedsAPeakToMeasureAgainst) {
  Hardware base = Base();
  base.set_peak_flops(0);
  absl::StatusOr<Hardware> hw =
      CalibrateDevice(base, core::Device::CPU(), core::DType::kF32, {{8, 8, 8}}, 1024);
  ASSERT_FALSE(hw.ok());
  EXPECT_NE(hw.status().message().find("--hardware needs peak_flops"), std::string::npos);
}

// The CPU calibration's arithmetic on made-up times (no clock involved).
TEST(CalibrateTest, CpuRatesFromTimes) {
  CpuTimes t;
  t.peak_flops = 1e11;
  // h = 256 at T = 256: 3 forms × 2·256·256²·12 FLOPs at 5e10 FLOP/s.
  const double set = 3 * 2.0 * 256 * 256 * 256 * 12;
  t.layer_gemms = {{256, set / 5e10}, {1024, 0.5}};
  t.attention = {{128, 8, 64, 2 * 128.0 * 128 * 8 * 64 / 2.5e10, 3 * 2 * 128.0 * 128 * 8 * 64 / 2.5e10},
                 {512, 8, 64, 2 * 512.0 * 512 * 8 * 64 / 5e10, 2 * 2 * 512.0 * 512 * 8 * 64 / 5e10}};
  t.optimizer_elements = 1000;
  t.optimizer = 1000 * 32 / 4e10;
  const CpuRates r = CpuRatesFromTimes(t);
  EXPECT_EQ(r.peak_flops, 1e11);
  ASSERT_EQ(r.gemm_efficiency.size(), 2u);
  // Each point at the set's mean GEMM (2·T·h²·3); 5e10 FLOP/s = 0.5 of peak.
  EXPECT_DOUBLE_EQ(r.gemm_efficiency[0].flops(), 2.0 * 256 * 256 * 256 * 3);
  EXPECT_NEAR(r.gemm_efficiency[0].efficiency(), 0.5, 1e-12);
  // T = max(256, h) = 1024: 3 × 2·1024·1024²·12 FLOPs in 0.5 s, above peak: capped at 1.
  EXPECT_DOUBLE_EQ(r.gemm_efficiency[1].flops(), 2.0 * 1024 * 1024 * 1024 * 3);
  EXPECT_EQ(r.gemm_efficiency[1].efficiency(), 1.0);
  ASSERT_EQ(r.attention_efficiency.size(), 2u);
  EXPECT_DOUBLE_EQ(r.attention_efficiency[0].flops(), 2 * 128.0 * 128 * 8 * 64);
  EXPECT_NEAR(r.attention_efficiency[0].efficiency(), 0.25, 1e-12);
  EXPECT_NEAR(r.attention_efficiency[1].efficiency(), 0.5, 1e-12);
  EXPECT_NEAR(r.attention_backward_ratio, (3 + 2) / 2.0, 1e-12);
  EXPECT_NEAR(r.optimizer_bandwidth, 4e10, 1e-3);
}

// Calibrate's output is a hardware file with every measured rate in it (the
// values are this machine's: only their presence and sanity are checked).
TEST(CalibrateTest, CpuCalibrationWritesEveryRate) {
  absl::StatusOr<std::string> text = Calibrate();
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<Hardware> hw = ParseHardware(*text, "calibrated");
  ASSERT_TRUE(hw.ok()) << hw.status() << "\n" << *text;
  EXPECT_EQ(hw->gemm_efficiency_size(), 5);
  EXPECT_EQ(hw->attention_curve_size(), 3);
  EXPECT_GT(hw->optimizer_bandwidth(), 0);
  EXPECT_GT(hw->attention_backward_ratio(), 0);
  EXPECT_GT(hw->intra_node().all_gather().bus_bandwidth(), 0);
}

TEST(CalibrateTest, DeviceShapesSpanTheTablesGemms) {
  const std::vector<GemmShape> shapes = DeviceGemmShapes();
  double lo = 1e300, hi = 0;
  for (const GemmShape& g : shapes) {
    lo = std::min(lo, 2.0 * g.m * g.n * g.k);
    hi = std::max(hi, 2.0 * g.m * g.n * g.k);
  }
  EXPECT_LE(lo, 1e8);
  EXPECT_GE(hi, 1e13);
}

}  // namespace
}  // namespace loom::plan
