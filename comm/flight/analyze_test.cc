#include "comm/flight/analyze.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "comm/flight/dump.h"
#include "gtest/gtest.h"

namespace loom::comm::flight {
namespace {

using core::DType;

constexpr uint64_t kDumpUs = 100000000;  // 100 s on each rank's clock

Record Op(OpKind kind, uint64_t seq, const std::string& state, uint64_t bytes = 4096,
          DType dtype = DType::kF32, int peer = -1) {
  Record r;
  r.id = seq;
  r.kind = kind;
  r.seq = seq;
  r.dtype = dtype;
  r.bytes = bytes;
  r.peer = peer;
  r.issued_us = kDumpUs - 20000000 + seq * 1000;  // 20 s before the dump and on
  if (state != "issued") r.started_us = r.issued_us;
  if (state == "completed" || state == "failed") r.completed_us = r.issued_us + 500;
  r.failed = state == "failed";
  return r;
}

// `n` all-reduces #0..n-1, completed, then `tail`.
std::vector<Record> AllReduces(int n, std::vector<Record> tail = {}) {
  std::vector<Record> out;
  for (int i = 0; i < n; ++i) out.push_back(Op(OpKind::kAllReduce, i, "completed"));
  out.insert(out.end(), tail.begin(), tail.end());
  for (size_t i = 0; i < out.size(); ++i) out[i].id = i;
  return out;
}

CommDump Comm(const std::string& group, std::vector<int> members, int world_rank,
              std::vector<Record> records) {
  CommDump c;
  c.info.group = group;
  c.info.backend = "local";
  c.info.world_rank = world_rank;
  c.info.group_size = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == world_rank) c.info.group_rank = static_cast<int>(i);
  }
  c.info.members = std::move(members);
  c.info.entries = 2048;
  c.issued = records.size();
  c.records = std::move(records);
  return c;
}

RankDump Rank(int world_rank, std::vector<CommDump> comms) {
  RankDump d;
  d.path = "dir/rank" + std::to_string(world_rank) + ".pid1.jsonl";
  d.world_rank = world_rank;
  d.pid = 1;
  d.host = "h";
  d.reason = "test";
  d.dump_us = kDumpUs;
  d.dump_unix_us = 1;
  d.tick_us = 10000;
  d.comms = std::move(comms);
  // Through the file format and back, as the tool reads it.
  auto parsed = ParseDump(FormatDump(d), d.path);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

std::string Text(const Analysis& a) { return a.Report(); }

TEST(FlightAnalyze, AllAgreeAndFinished) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 3; ++r) dumps.push_back(Rank(r, {Comm("world", {0, 1, 2}, r, AllReduces(5))}));
  Analysis a = Analyze(dumps);
  EXPECT_EQ(a.exit_code(), 0) << Text(a);
  EXPECT_TRUE(a.culprits.empty());
  EXPECT_NE(Text(a).find("all 3 dumped ranks agree"), std::string::npos) << Text(a);
}

TEST(FlightAnalyze, NamesTheRankThatNeverIssued) {
  // Ranks 0 and 2 issued all_reduce #57 and wait in it; rank 1 stopped after #56.
  std::vector<RankDump> dumps;
  for (int r : {0, 2}) {
    dumps.push_back(Rank(r, {Comm("dp", {0, 1, 2}, r,
                                  AllReduces(57, {Op(OpKind::kAllReduce, 57, "failed")}))}));
  }
  dumps.push_back(Rank(1, {Comm("dp", {0, 1, 2}, 1, AllReduces(57))}));
  Analysis a = Analyze(dumps);
  const std::string t = Text(a);
  EXPECT_EQ(a.exit_code(), 1);
  EXPECT_EQ(a.culprits, std::vector<int>{1}) << t;
  EXPECT_NE(t.find("group 'dp' (world ranks 0,1,2): all_reduce #57 (f32, 4096 B): issued by "
                   "ranks 0, 2; never issued by rank 1 (its last op: all_reduce #56, completed "
                   "19.9 s before the dump)"),
            std::string::npos)
      << t;
}

TEST(FlightAnalyze, AMissingDumpIsNamedWithTheFirstUnfinishedOp) {
  // Rank 3 wrote no file: ranks 0-2 wait in barrier #3, which names it. The
  // tp group {0,1} is fine.
  std::vector<RankDump> dumps;
  for (int r : {0, 1}) {
    dumps.push_back(Rank(r, {Comm("world", {0, 1, 2, 3}, r, AllReduces(3, {Op(OpKind::kBarrier, 3, "started", 0, DType::kU8)})),
                             Comm("tp", {0, 1}, r, AllReduces(2))}));
  }
  dumps.push_back(Rank(2, {Comm("world", {0, 1, 2, 3}, 2, AllReduces(3, {Op(OpKind::kBarrier, 3, "started", 0, DType::kU8)}))}));
  Analysis a = Analyze(dumps);
  const std::string t = Text(a);
  EXPECT_EQ(a.exit_code(), 1);
  EXPECT_EQ(a.culprits, std::vector<int>{3}) << t;
  EXPECT_NE(t.find("barrier #3 (u8, 0 B): issued by ranks 0, 1, 2; never finished on ranks 0, 1, "
                   "2; "),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("; no record from rank 3 (rank 3: no dump file from this rank): dead, or "
                   "hung without dumping? Send it SIGUSR1"),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("group 'tp' (world ranks 0,1)"), std::string::npos) << t;
}

TEST(FlightAnalyze, NamesTheRanksThatDisagree) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 3; ++r) {
    Record last = Op(OpKind::kAllReduce, 4, "started", r == 2 ? 2048 : 4096);
    dumps.push_back(Rank(r, {Comm("tp", {0, 1, 2}, r, AllReduces(4, {last}))}));
  }
  Analysis a = Analyze(dumps);
  const std::string t = Text(a);
  EXPECT_EQ(a.exit_code(), 1);
  EXPECT_EQ(a.culprits, std::vector<int>{2}) << t;
  EXPECT_NE(t.find("collective #4: the ranks disagree on the op: rank 2: all_reduce #4 (f32, "
                   "2048 B); ranks 0, 1: all_reduce #4 (f32, 4096 B)"),
            std::string::npos)
      << t;
}

// all_to_all_v moves per-rank byte counts: only the op and dtype must agree.
TEST(FlightAnalyze, AllToAllVBytesMayDiffer) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 3; ++r) {
    Record last = Op(OpKind::kAllToAllV, 4, "completed", 1024 * (r + 1));
    dumps.push_back(Rank(r, {Comm("ep", {0, 1, 2}, r, AllReduces(4, {last}))}));
  }
  Analysis a = Analyze(dumps);
  EXPECT_EQ(a.exit_code(), 0) << Text(a);
  EXPECT_TRUE(a.culprits.empty()) << Text(a);
}

TEST(FlightAnalyze, DisagreementOnTheOpItself) {
  std::vector<RankDump> dumps;
  dumps.push_back(Rank(0, {Comm("pp", {0, 1}, 0, AllReduces(2, {Op(OpKind::kBroadcast, 2, "started", 64, DType::kF32, 0)}))}));
  dumps.push_back(Rank(1, {Comm("pp", {0, 1}, 1, AllReduces(2, {Op(OpKind::kAllGather, 2, "started", 64, DType::kBF16)}))}));
  Analysis a = Analyze(dumps);
  const std::string t = Text(a);
  EXPECT_EQ(a.exit_code(), 1);
  EXPECT_EQ(a.culprits, (std::vector<int>{0, 1})) << t;  // a tie names both
  EXPECT_NE(t.find("broadcast #2 (f32, 64 B, root group rank 0 = world rank 0)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("all_gather #2 (bf16, 64 B)"), std::string::npos) << t;
}

TEST(FlightAnalyze, NeverFinished) {
  std::vector<RankDump> dumps;
  for (int r = 0; r < 2; ++r) {
    dumps.push_back(Rank(r, {Comm("world", {0, 1}, r,
                                  AllReduces(7, {Op(OpKind::kAllReduce, 7, r == 0 ? "started" : "completed")}))}));
  }
  Analysis a = Analyze(dumps);
  const std::string t = Text(a);
  EXPECT_EQ(a.exit_code(), 1);
  EXPECT_NE(t.find("all_reduce #7 (f32, 4096 B): issued by every rank; never finished on rank "
                   "0; finished on rank 1; (rank 0: started 20.0 s before the dump, not "
                   "finished)"),
            std::string::npos)
      << t;
}

TEST(FlightAnalyze, UnfinishedPointToPoint) {
  std::vector<RankDump> dumps;
  dumps.push_back(Rank(0, {Comm("pp", {4, 5}, 4, {Op(OpKind::kSend, 0, "started", 64, DType::kF32, 1)})}));
  dumps.push_back(Rank(1, {Comm("pp", {4, 5}, 5, {})}));
  dumps[0].world_rank = 4;
  dumps[1].world_rank = 5;
  Analysis a = Analyze(dumps);
  const std::string t = Text(a);
  EXPECT_EQ(a.exit_code(), 1);
  EXPECT_NE(t.find("send #0 (f32, 64 B, to group rank 1 = world rank 5) on rank 4: started"),
            std::string::npos)
      << t;
}

TEST(FlightAnalyze, WrappedRingsStartWhereEveryRankHasOps) {
  // Rank 0's ring kept #10..#19 of 20, rank 1's #5..#19: nothing before #10
  // is compared, and all agree.
  std::vector<RankDump> dumps;
  std::vector<Record> r0(AllReduces(20)), r1(AllReduces(20));
  r0.erase(r0.begin(), r0.begin() + 10);
  r1.erase(r1.begin(), r1.begin() + 5);
  CommDump c0 = Comm("world", {0, 1}, 0, r0), c1 = Comm("world", {0, 1}, 1, r1);
  c0.issued = c1.issued = 20;
  dumps.push_back(Rank(0, {c0}));
  dumps.push_back(Rank(1, {c1}));
  Analysis a = Analyze(dumps);
  EXPECT_EQ(a.exit_code(), 0) << Text(a);
}

}  // namespace
}  // namespace loom::comm::flight
