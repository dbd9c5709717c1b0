#include "train/loss_plot.h"

#include <fstream>

#include "gtest/gtest.h"

namespace loom::train {
namespace {

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(LossPlotTest, ReadsMetricsAndDrawsBothSeries) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/m.jsonl";
  std::ofstream(path) << "{\"iteration\": 1, \"loss\": 5.5}\n{\"iteration\": 2, \"loss\": 4.0}\n"
                         "{\"iteration\": 2, \"valid_loss\": 4.2}\n";
  auto curve = ReadMetrics(path);
  ASSERT_TRUE(curve.ok()) << curve.status();
  EXPECT_EQ(curve->train.size(), 2u);
  EXPECT_EQ(curve->valid.size(), 1u);
  std::string svg = RenderLossSvg(*curve, "t");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(Count(svg, "<polyline class=\"train\""), 1);
  EXPECT_EQ(Count(svg, "<circle class=\"valid\""), 1);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(LossPlotTest, BadLinesNameFileAndLine) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/bad.jsonl";
  std::ofstream(path) << "{\"iteration\": 1, \"loss\": 5.5}\nnot json\n";
  auto curve = ReadMetrics(path);
  ASSERT_FALSE(curve.ok());
  EXPECT_NE(curve.status().message().find("bad.jsonl:2"), std::string::npos);
  EXPECT_FALSE(ReadMetrics("/nonexistent.jsonl").ok());
}

}  // namespace
}  // namespace loom::train
