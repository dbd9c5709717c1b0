// --log-straggler end to end: a tiny run of 4 data-parallel ranks (threads,
// local backend) where LOOM_FAULT kind=slow makes one rank sleep 300 ms in
// every forward-backward; each "straggler:" line of rank 0's log names that
// rank as the slowest, well above the median, and never as the fastest. The
// delay is many times a tiny step, so a loaded machine cannot move it; only
// the rank and a 1.5x bound are asserted.
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

using testing::Layout;

constexpr int kSlowRank = 2;

struct Line {
  std::string text;  // as logged, for failure messages
  int64_t iteration = 0;
  int ranks = 0;
  double median_ms = 0;
  std::vector<int> slowest, fastest;
  std::vector<double> slowest_x;
};

// The lines of the format train/straggler.h documents.
std::vector<Line> StragglerLines(const std::vector<std::string>& log) {
  static const std::regex head(
      R"(^ straggler: iteration (\d+): median compute ([0-9.]+) ms/iteration over (\d+) )"
      R"(ranks?; slowest (.*); fastest (.*)$)");
  static const std::regex entry(R"(rank (\d+) \(host [^)]*\) ([0-9.]+) ms ([0-9.]+|inf)x)");
  std::vector<Line> lines;
  for (const std::string& text : log) {
    if (text.find("straggler:") == std::string::npos) continue;
    std::smatch m;
    EXPECT_TRUE(std::regex_match(text, m, head)) << text;
    if (m.empty()) continue;
    std::printf("%s\n", text.c_str());  // the test log shows what was checked
    Line l;
    l.text = text;
    l.iteration = std::stoll(m[1]);
    l.median_ms = std::stod(m[2]);
    l.ranks = std::stoi(m[3]);
    for (int list : {4, 5}) {
      const std::string part = m[list];
      for (auto it = std::sregex_iterator(part.begin(), part.end(), entry);
           it != std::sregex_iterator(); ++it) {
        (list == 4 ? l.slowest : l.fastest).push_back(std::stoi((*it)[1]));
        if (list == 4) l.slowest_x.push_back(std::stod((*it)[3]));
      }
    }
    lines.push_back(l);
  }
  return lines;
}

TrainConfig SlowRankRun(int minmax_count) {
  const Layout l{1, 1, 4};
  TrainConfig c = testing::TinyConfig(l, 6);
  c.log_interval = 3;
  c.log_straggler = true;
  c.straggler_minmax_count = minmax_count;
  c.fault_injection = "rank=2,iteration=1,kind=slow,ms=300";
  return c;
}

TEST(StragglerTrainingTest, NamesTheDelayedRank) {
  const testing::RunResult r = testing::Run(SlowRankRun(1), Layout{1, 1, 4});
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<Line> lines = StragglerLines(r.log);
  ASSERT_EQ(lines.size(), 2u);  // one per log line: iterations 3 and 6
  EXPECT_EQ(lines[0].iteration, 3);
  EXPECT_EQ(lines[1].iteration, 6);
  for (const Line& l : lines) {
    EXPECT_EQ(l.ranks, 4);
    ASSERT_EQ(l.slowest.size(), 1u);
    EXPECT_EQ(l.slowest[0], kSlowRank) << l.text;
    EXPECT_GT(l.slowest_x[0], 1.5) << l.text;
    ASSERT_EQ(l.fastest.size(), 1u);
    EXPECT_NE(l.fastest[0], kSlowRank) << l.text;
  }
}

TEST(StragglerTrainingTest, MinmaxCountListsMoreRanks) {
  const testing::RunResult r = testing::Run(SlowRankRun(2), Layout{1, 1, 4});
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<Line> lines = StragglerLines(r.log);
  ASSERT_EQ(lines.size(), 2u);
  for (const Line& l : lines) {
    ASSERT_EQ(l.slowest.size(), 2u);
    ASSERT_EQ(l.fastest.size(), 2u);
    EXPECT_EQ(l.slowest[0], kSlowRank) << l.text;
    EXPECT_GT(l.slowest_x[0], 1.5) << l.text;
    EXPECT_GE(l.slowest_x[0], l.slowest_x[1]) << l.text;  // slowest first
    for (int rank : l.fastest) EXPECT_NE(rank, kSlowRank) << l.text;
  }
}

TEST(StragglerTrainingTest, OffByDefault) {
  TrainConfig c = SlowRankRun(1);
  c.log_straggler = false;
  c.fault_injection.clear();
  const testing::RunResult r = testing::Run(c, Layout{1, 1, 4});
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(StragglerLines(r.log).empty());
}

}  // namespace
}  // namespace loom::train
