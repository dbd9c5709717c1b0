#include "profile/chrome_trace.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::profile {
namespace {

using nlohmann::json;

Event Span(const std::string& name, const std::string& track, double ts, double dur,
           const std::string& args = "") {
  Event e;
  e.name = name;
  e.cat = "compute";
  e.track = track;
  e.ts_us = ts;
  e.dur_us = dur;
  e.args = args;
  return e;
}

TEST(ChromeTraceTest, LanesKeepNestedSpansTogetherAndSplitOverlaps) {
  // [0,10) holds [1,3) and [3,9) which holds [4,5); [8,12) overlaps [3,9)
  // and [0,10) without nesting: it needs a second lane.
  std::vector<Event> spans = {Span("a", "t", 0, 10), Span("b", "t", 1, 2), Span("c", "t", 3, 6),
                              Span("d", "t", 4, 1), Span("e", "t", 8, 4), Span("f", "t", 12, 1)};
  EXPECT_EQ(AssignLanes(spans), (std::vector<int>{0, 0, 0, 0, 1, 0}));
}

TEST(ChromeTraceTest, RankTraceRoundTripsAsValidJson) {
  RankTrace r;
  r.rank = 3;
  r.host = "h\"1";
  r.sync_us = 1000.5;
  r.step_start = 2;
  r.step_end = 4;
  r.events = {Span("forward-compute", "main", 1001, 5, R"({"micro_batch":0,"chunk":0})"),
              Span("all_reduce", "comm dp", 1002, 10, R"({"bytes":4096,"ranks":[1,3]})"),
              Span("all_reduce", "comm dp", 1003, 10, R"({"bytes":8})")};
  const std::string text = FormatRankTrace(r);
  json j = json::parse(text);  // throws (fails the test) on invalid JSON
  int x = 0, threads = 0;
  for (const json& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "X") ++x;
    if (e["name"] == "thread_name") ++threads;
    if (e["name"] == "process_name") {
      EXPECT_EQ(e["args"]["name"], "rank 3");
    }
  }
  EXPECT_EQ(x, 3);
  EXPECT_EQ(threads, 3);  // main, comm dp, comm dp #2 (the two all-reduces overlap)
  absl::StatusOr<RankTrace> back = ParseRankTrace(text, "rank-3.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->host, "h\"1");
  EXPECT_DOUBLE_EQ(back->sync_us, 1000.5);
  EXPECT_EQ(back->step_end, 4);
  ASSERT_EQ(back->events.size(), 3u);
  EXPECT_EQ(back->events[1].track, "comm dp");
  EXPECT_EQ(back->events[2].track, "comm dp");  // lanes folded back
  EXPECT_EQ(json::parse(back->events[1].args)["ranks"], json::parse("[1,3]"));

  EXPECT_FALSE(ParseRankTrace("{\"traceEvents\":[]}", "x.json").ok());
  absl::StatusOr<ParsedTrace> bad = ParseTrace("[1, 2", "broken.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("broken.json"), std::string::npos);
}

TEST(ChromeTraceTest, MergeGivesOnePidPerRankOnRankZerosClock) {
  RankTrace a, b, c;
  a.rank = 0;
  a.host = b.host = "one";
  c.host = "two";
  b.rank = 1;
  c.rank = 2;
  a.sync_us = 100;
  b.sync_us = 99;  // same host: its own times are already comparable; the origin
  c.sync_us = 5000;  // another host: aligned at the barrier
  a.events = {Span("x", "main", 110, 1)};
  b.events = {Span("x", "main", 120, 1)};
  c.events = {Span("x", "main", 5010, 1)};
  json j = json::parse(FormatMergedTrace({a, b, c}));
  std::map<int, double> ts;
  std::set<int> named;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "X") ts[e["pid"]] = e["ts"];
    if (e["name"] == "process_name") named.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(named, (std::set<int>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(ts[0], 11);
  EXPECT_DOUBLE_EQ(ts[1], 21);
  EXPECT_DOUBLE_EQ(ts[2], 11);  // 10 after its sync, which is rank 0's (1 after the origin)
}

}  // namespace
}  // namespace loom::profile
