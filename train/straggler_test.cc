// --log-straggler's parts: the report from per-rank times (median of odd and
// even counts, ties, the N slowest and fastest, one rank), its line, the
// detector's accumulation and all-gather over local ranks on fake clocks,
// and the flags (read from the command line, refused in Finalize by name).
#include "train/straggler.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "comm/launch/flags.h"
#include "comm/testing/ranks_as_threads.h"
#include "config/config.h"
#include "gtest/gtest.h"
#include "train/gpt_flags.h"

namespace loom::train {
namespace {

std::vector<int> Ranks(const std::vector<RankTime>& list) {
  std::vector<int> ranks;
  for (const RankTime& t : list) ranks.push_back(t.rank);
  return ranks;
}

TEST(StragglerTest, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({7}), 7);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({10, 10, 1, 1}), 5.5);
  EXPECT_EQ(Median({5, 5, 5, 9, 1}), 5);
}

TEST(StragglerTest, NamesTheSlowestAndFastestAgainstTheMedian) {
  const StragglerReport r =
      MakeStragglerReport(20, {100, 250, 110, 90}, {"a", "b", "c", "d"}, /*minmax_count=*/1);
  EXPECT_EQ(r.iteration, 20);
  EXPECT_EQ(r.ranks, 4);
  EXPECT_DOUBLE_EQ(r.median_ms, 105);
  ASSERT_EQ(r.slowest.size(), 1u);
  EXPECT_EQ(r.slowest[0].rank, 1);
  EXPECT_EQ(r.slowest[0].host, "b");
  EXPECT_DOUBLE_EQ(r.slowest[0].ms, 250);
  EXPECT_DOUBLE_EQ(r.slowest[0].slowdown, 250.0 / 105);
  ASSERT_EQ(r.fastest.size(), 1u);
  EXPECT_EQ(r.fastest[0].rank, 3);
  EXPECT_DOUBLE_EQ(r.fastest[0].slowdown, 90.0 / 105);
  EXPECT_EQ(FormatStragglerReport(r),
            " straggler: iteration 20: median compute 105.0 ms/iteration over 4 ranks; slowest "
            "rank 1 (host b) 250.0 ms 2.38x; fastest rank 3 (host d) 90.0 ms 0.86x");
}

TEST(StragglerTest, TheNSlowestInOrderAndTiesByRank) {
  const StragglerReport r = MakeStragglerReport(5, {50, 80, 80, 20, 50}, {}, 3);
  EXPECT_DOUBLE_EQ(r.median_ms, 50);
  EXPECT_EQ(Ranks(r.slowest), (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(Ranks(r.fastest), (std::vector<int>{3, 0, 4}));
  // No hosts: no parentheses; several per list, ", "-separated.
  EXPECT_EQ(FormatStragglerReport(r),
            " straggler: iteration 5: median compute 50.0 ms/iteration over 5 ranks; slowest "
            "rank 1 80.0 ms 1.60x, rank 2 80.0 ms 1.60x, rank 0 50.0 ms 1.00x; fastest rank 3 "
            "20.0 ms 0.40x, rank 0 50.0 ms 1.00x, rank 4 50.0 ms 1.00x");
  // All equal: the lowest ranks both ways.
  const StragglerReport same = MakeStragglerReport(5, {7, 7, 7}, {}, 2);
  EXPECT_EQ(Ranks(same.slowest), (std::vector<int>{0, 1}));
  EXPECT_EQ(Ranks(same.fastest), (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(same.slowest[0].slowdown, 1);
  // More than the ranks: every rank, once per list.
  const StragglerReport all = MakeStragglerReport(5, {3, 1}, {}, 8);
  EXPECT_EQ(Ranks(all.slowest), (std::vector<int>{0, 1}));
  EXPECT_EQ(Ranks(all.fastest), (std::vector<int>{1, 0}));
}

TEST(StragglerTest, OneRankAndZeroTimes) {
  const StragglerReport one = MakeStragglerReport(1, {12.5}, {"h"}, 1);
  EXPECT_EQ(FormatStragglerReport(one),
            " straggler: iteration 1: median compute 12.5 ms/iteration over 1 rank; slowest "
            "rank 0 (host h) 12.5 ms 1.00x; fastest rank 0 (host h) 12.5 ms 1.00x");
  const StragglerReport zeros = MakeStragglerReport(1, {0, 0, 4}, {}, 1);
  EXPECT_EQ(zeros.median_ms, 0);
  EXPECT_TRUE(std::isinf(zeros.slowest[0].slowdown));
  EXPECT_EQ(zeros.fastest[0].slowdown, 1);
}

TEST(StragglerTest, DetectorGathersEveryRanksComputePerIteration) {
  // Rank r's compute takes (r + 1) x 10 ms per region on its own fake
  // clock; the time between regions (a collective's wait) is not counted.
  std::vector<StragglerReport> reports(3);
  absl::Status s = comm::testing::RunRanksAsThreads(3, [&](int rank, comm::Communicator* world) {
    int64_t now = 0;
    StragglerDetector d(true, 1, [&now] { return now; });
    for (int step = 0; step < 4; ++step) {
      d.Start();
      now += (rank + 1) * 10'000'000;  // forward-backward
      d.Stop();
      now += 1'000'000'000;  // waiting for the others: left out
      d.Start();
      now += (rank + 1) * 5'000'000;  // optimizer
      d.Stop();
    }
    d.Stop();  // unmatched: ignored
    absl::StatusOr<StragglerReport> r = d.Report(world, 4, 4);
    if (!r.ok()) return r.status();
    // Reset by the report: the next interval starts from zero.
    d.Start();
    now += 1'000'000;
    d.Stop();
    absl::StatusOr<StragglerReport> next = d.Report(world, 5, 1);
    if (!next.ok()) return next.status();
    if (next->slowest[0].ms != 1.0) return absl::InternalError("not reset");
    reports[rank] = *r;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (const StragglerReport& r : reports) {  // every rank gets the same report
    EXPECT_EQ(r.ranks, 3);
    EXPECT_DOUBLE_EQ(r.median_ms, 30);
    ASSERT_EQ(r.slowest.size(), 1u);
    EXPECT_EQ(r.slowest[0].rank, 2);
    EXPECT_DOUBLE_EQ(r.slowest[0].ms, 45);
    EXPECT_DOUBLE_EQ(r.slowest[0].slowdown, 1.5);
    EXPECT_FALSE(r.slowest[0].host.empty());
    EXPECT_EQ(r.fastest[0].rank, 0);
  }
}

TEST(StragglerTest, DisabledCostsNothingAndSendsNothing) {
  int64_t now = 0;
  StragglerDetector d(false, 1, [&now] { return ++now; });
  d.Start();
  d.Stop();
  EXPECT_EQ(now, 0);  // the clock was never read
  absl::StatusOr<StragglerReport> r = d.Report(nullptr, 1, 1);  // no communicator touched
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ranks, 0);
}

void Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gpt");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  comm::launch::ParseFlags(static_cast<int>(argv.size()), argv.data(), "straggler_test");
}

std::string FinalizeError(TrainConfig c) {
  const absl::Status s = Finalize(&c, 2);
  EXPECT_FALSE(s.ok());
  return std::string(s.message());
}

TEST(StragglerTest, FlagsAndTheirRefusals) {
  {
    absl::FlagSaver saver;
    Parse({});
    const TrainConfig c = ConfigFromFlags();
    EXPECT_FALSE(c.log_straggler);
    EXPECT_EQ(c.straggler_minmax_count, 1);
    EXPECT_FALSE(c.disable_straggler_on_startup);
    EXPECT_FALSE(c.straggler_ctrlr_port.has_value());
    TrainConfig d;
    EXPECT_EQ(c.log_straggler, d.log_straggler);
    EXPECT_EQ(c.straggler_minmax_count, d.straggler_minmax_count);
  }
  {
    absl::FlagSaver saver;
    Parse({"--log-straggler", "--straggler-minmax-count=3"});
    TrainConfig c = ConfigFromFlags();
    EXPECT_TRUE(c.log_straggler);
    EXPECT_EQ(c.straggler_minmax_count, 3);
    EXPECT_TRUE(Finalize(&c, 2).ok());  // more than the ranks: all of them are listed
  }
  TrainConfig c;
  c.log_straggler = true;
  for (int bad : {0, -2}) {
    c.straggler_minmax_count = bad;
    EXPECT_NE(FinalizeError(c).find("--straggler-minmax-count (" + std::to_string(bad) +
                                    ") must be >= 1"),
              std::string::npos)
        << FinalizeError(c);
  }
  c.log_straggler = false;
  c.straggler_minmax_count = 2;
  EXPECT_NE(FinalizeError(c).find("--straggler-minmax-count (2) needs --log-straggler"),
            std::string::npos)
      << FinalizeError(c);
  // Megatron's run-time controller is not Loom's: refused by name, not ignored.
  {
    absl::FlagSaver saver;
    Parse({"--log-straggler", "--straggler-ctrlr-port=65535"});
    const std::string e = FinalizeError(ConfigFromFlags());
    EXPECT_NE(e.find("--straggler-ctrlr-port belongs to Megatron's run-time straggler "
                     "controller"),
              std::string::npos)
        << e;
  }
  {
    absl::FlagSaver saver;
    Parse({"--log-straggler", "--disable-straggler-on-startup"});
    const std::string e = FinalizeError(ConfigFromFlags());
    EXPECT_NE(e.find("--disable-straggler-on-startup belongs to"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace loom::train
