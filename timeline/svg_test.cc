#include "timeline/svg.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::timeline {
namespace {

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(what, at)) != std::string::npos; ++at) ++n;
  return n;
}

TEST(SvgTest, RowsLanesBoxesAndTheAxis) {
  SvgRow a{"rank 0", 2, {}};
  a.boxes.push_back({0, 10, "outer", SvgColor(0, 0.65, 0.7), "outer <10 ms>", 0});
  a.boxes.push_back({2, 4, "inner", SvgColor(120, 0.65, 0.7), "inner", 1});
  SvgRow b{"rank \"1\"", 1, {{1, 5, "x&y", "#000000", "t", 0}}};
  SvgOptions o;
  o.pixels_per_unit = 10;
  o.row_height = 20;
  const std::string svg = RenderRowsSvg({a, b}, "a <title>", "ms", o);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(Count(svg, "<g class=\"row\""), 2u);
  EXPECT_EQ(Count(svg, "class=\"box\""), 3u);
  // The second lane of row 0 is one row height below its first.
  EXPECT_NE(svg.find("data-name=\"inner\" x=\"100.00\" y=\"" + std::to_string(kTop + 20 + 1)),
            std::string::npos)
      << svg;
  // Row 1 starts below both lanes of row 0 and the gap.
  EXPECT_NE(svg.find("data-row=\"1\" data-name=\"x&amp;y\" x=\"90.00\" y=\"" +
                     std::to_string(kTop + 2 * 20 + kRowGap + 1)),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find("a &lt;title&gt;"), std::string::npos);
  EXPECT_NE(svg.find("rank &quot;1&quot;"), std::string::npos);
  EXPECT_NE(svg.find("time (ms)"), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(SvgTest, ColoursAndEscapes) {
  EXPECT_EQ(SvgColor(0, 1, 0.5), "#ff0000");
  EXPECT_EQ(SvgColor(120, 1, 0.5), "#00ff00");
  EXPECT_EQ(SvgColor(240, 1, 0.5), "#0000ff");
  EXPECT_EQ(SvgColor(0, 0, 1), "#ffffff");
  EXPECT_EQ(EscapeXml("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
}

TEST(SvgTest, AxisTicksAreOneTwoOrFiveTimesAPowerOfTen) {
  std::string svg;
  AppendTimeAxis(&svg, 100, 330, 33, 10, "cost units");
  // 33 units: ticks every 2 (0, 2, ..., 32), 17 of them.
  EXPECT_EQ(Count(svg, "text-anchor=\"middle\""), 17u) << svg;
  EXPECT_NE(svg.find(">32</text>"), std::string::npos);
  EXPECT_NE(svg.find("time (cost units)"), std::string::npos);
}

}  // namespace
}  // namespace loom::timeline
