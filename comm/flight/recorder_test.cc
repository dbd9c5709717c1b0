#include "comm/flight/recorder.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/flight/dump.h"
#include "gtest/gtest.h"

namespace loom::comm::flight {
namespace {

using core::DType;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name, ".", getpid());
}

CommInfo Info(int entries, const std::string& dir = "") {
  CommInfo i;
  i.group = "tp";
  i.backend = "local";
  i.world_rank = 3;
  i.group_rank = 1;
  i.group_size = 2;
  i.members = {2, 3};
  i.entries = entries;
  i.dir = dir;
  return i;
}

TEST(FlightRecorder, RingWrapsAndKeepsTheLastOps) {
  auto r = Recorder::Create(Info(5));  // rounded up to 8
  ASSERT_EQ(r->capacity(), 8u);
  for (uint64_t i = 0; i < 20; ++i) {
    uint64_t id = r->Issue(OpKind::kAllReduce, i, DType::kF32, 4 * i);
    EXPECT_EQ(id, i);
    r->Start(id);
    r->Complete(id, true);
  }
  std::vector<Record> s = r->Snapshot();
  ASSERT_EQ(s.size(), 8u);
  for (size_t k = 0; k < s.size(); ++k) {
    EXPECT_EQ(s[k].id, 12 + k);
    EXPECT_EQ(s[k].seq, 12 + k);
    EXPECT_EQ(s[k].bytes, 4 * (12 + k));
    EXPECT_EQ(s[k].kind, OpKind::kAllReduce);
    EXPECT_EQ(s[k].dtype, DType::kF32);
    EXPECT_NE(s[k].completed_us, 0u);
  }
  EXPECT_EQ(r->issued(), 20u);
}

TEST(FlightRecorder, LateWriteForAReusedSlotIsIgnored) {
  auto r = Recorder::Create(Info(4));
  const uint64_t old = r->Issue(OpKind::kSend, 0, DType::kF32, 16, /*peer=*/1, /*tag=*/7);
  for (int i = 0; i < 4; ++i) r->Issue(OpKind::kAllReduce, i, DType::kF32, 4);
  r->Start(old);
  r->Complete(old, false);  // slot 0 now holds id 4: must stay pending
  std::vector<Record> s = r->Snapshot();
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].id, 1u);
  EXPECT_EQ(s[3].id, 4u);  // in slot 0
  EXPECT_EQ(s[3].started_us, 0u);
  EXPECT_EQ(s[3].completed_us, 0u);
  EXPECT_FALSE(s[3].failed);
}

TEST(FlightRecorder, SnapshotsDuringRecordingAreConsistent) {
  // One thread records (as an issuing thread and a worker would), another
  // reads: every entry read back must be whole (seq, bytes and kind of one op).
  auto r = Recorder::Create(Info(64));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const uint64_t id = r->Issue(i % 2 ? OpKind::kAllGather : OpKind::kAllReduce, i,
                                   DType::kF32, 4 * i, static_cast<int>(i % 7));
      r->Start(id);
      r->Complete(id, i % 3 != 0);
    }
  });
  while (r->issued() < 1000) std::this_thread::yield();
  size_t seen = 0;
  for (int k = 0; k < 2000; ++k) {
    std::vector<Record> s = r->Snapshot();
    for (const Record& e : s) {
      ASSERT_EQ(e.seq, e.id);
      ASSERT_EQ(e.bytes, 4 * e.id);
      ASSERT_EQ(e.kind, e.id % 2 ? OpKind::kAllGather : OpKind::kAllReduce);
      ASSERT_EQ(e.peer, static_cast<int>(e.id % 7));
      if (e.completed_us != 0) {
        ASSERT_EQ(e.failed, e.id % 3 == 0);
      }
    }
    for (size_t i = 1; i < s.size(); ++i) ASSERT_GT(s[i].id, s[i - 1].id);
    seen += s.size();
  }
  stop = true;
  writer.join();
  EXPECT_GT(seen, 0u);
}

TEST(FlightRecorder, TimestampsAreMonotoneAndAdvance) {
  auto r = Recorder::Create(Info(64));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) {
    uint64_t id = r->Issue(OpKind::kBroadcast, i, DType::kBF16, 8, /*root=*/0);
    r->Start(id);
    absl::SleepFor(absl::Milliseconds(25));  // > kTick
    r->Complete(id, i != 5);
    ids.push_back(id);
  }
  std::vector<Record> s = r->Snapshot();
  ASSERT_EQ(s.size(), 6u);
  for (size_t k = 0; k < s.size(); ++k) {
    EXPECT_GE(s[k].started_us, s[k].issued_us);
    EXPECT_GE(s[k].completed_us, s[k].started_us);
    if (k > 0) {
      EXPECT_GE(s[k].issued_us, s[k - 1].completed_us);
    }
    EXPECT_EQ(s[k].peer, 0);
    EXPECT_EQ(s[k].tag, -1);
  }
  EXPECT_TRUE(s[5].failed);
  EXPECT_FALSE(s[4].failed);
  // Six 25 ms sleeps: the clock moved by at least ~100 ms (a tick is 10 ms;
  // generous for a loaded machine).
  EXPECT_GE(s[5].completed_us - s[0].issued_us, 100000u);
}

TEST(FlightRecorder, DumpParsesBackToWhatWasRecorded) {
  const std::string dir = TestDir("roundtrip");
  auto r = Recorder::Create(Info(16, dir));
  r->Issue(OpKind::kAllReduce, 0, DType::kF32, 4096);
  r->Complete(0, true);
  uint64_t a = r->Issue(OpKind::kRecv, 0, DType::kI32, 12, /*peer=*/0, /*tag=*/5);
  r->Start(a);
  r->Issue(OpKind::kAllGather, 1, DType::kBF16, 64);
  auto written = DumpProcess("test \"reason\"\nline two");
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), 1u);
  EXPECT_EQ((*written)[0], DumpPath(dir, 3));
  auto d = ReadDump((*written)[0]);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->world_rank, 3);
  EXPECT_EQ(d->pid, getpid());
  EXPECT_EQ(d->reason, "test \"reason\"\nline two");
  EXPECT_GE(d->dump_us, 1u);
  ASSERT_EQ(d->comms.size(), 1u);
  const CommDump& c = d->comms[0];
  EXPECT_EQ(c.info.group, "tp");
  EXPECT_EQ(c.info.backend, "local");
  EXPECT_EQ(c.info.members, (std::vector<int>{2, 3}));
  EXPECT_EQ(c.info.group_rank, 1);
  EXPECT_EQ(c.info.entries, 16);
  EXPECT_EQ(c.issued, 3u);
  std::vector<Record> want = r->Snapshot();
  ASSERT_EQ(c.records.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    const Record& g = c.records[k];
    EXPECT_EQ(g.id, want[k].id);
    EXPECT_EQ(g.kind, want[k].kind);
    EXPECT_EQ(g.seq, want[k].seq);
    EXPECT_EQ(g.dtype, want[k].dtype);
    EXPECT_EQ(g.bytes, want[k].bytes);
    EXPECT_EQ(g.peer, want[k].peer);
    EXPECT_EQ(g.tag, want[k].tag);
    EXPECT_EQ(g.issued_us, want[k].issued_us);
    EXPECT_EQ(g.started_us, want[k].started_us);
    EXPECT_EQ(g.completed_us, want[k].completed_us);
    EXPECT_EQ(g.failed, want[k].failed);
  }
  EXPECT_EQ(c.records[1].kind, OpKind::kRecv);
  EXPECT_EQ(c.records[1].tag, 5);
  EXPECT_NE(c.records[1].started_us, 0u);
  EXPECT_EQ(c.records[1].completed_us, 0u);
  EXPECT_EQ(c.records[2].started_us, 0u);
  // No temporary file is left behind.
  EXPECT_NE(access((dir + "/.rank3.pid" + std::to_string(getpid()) + ".jsonl.tmp").c_str(), F_OK),
            0);
}

TEST(FlightRecorder, NoFolderNoDump) {
  auto r = Recorder::Create(Info(8));
  r->Issue(OpKind::kBarrier, 0, DType::kU8, 0);
  auto written = DumpProcess("nothing to write");
  ASSERT_TRUE(written.ok());
  for (const std::string& f : *written) EXPECT_EQ(f.find("rank3."), std::string::npos) << f;
}

TEST(FlightRecorder, Sigusr1WritesADumpAndRecordingGoesOn) {
  const std::string dir = TestDir("sigusr1");
  auto r = Recorder::Create(Info(8, dir));
  r->Issue(OpKind::kAllReduce, 0, DType::kF32, 4);
  const std::string path = DumpPath(dir, 3);
  ASSERT_EQ(raise(SIGUSR1), 0);  // the default action would kill the test
  absl::Time until = absl::Now() + absl::Seconds(20);
  while (access(path.c_str(), F_OK) != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  auto d = ReadDump(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->reason, "SIGUSR1");
  ASSERT_EQ(d->comms.size(), 1u);
  EXPECT_EQ(d->comms[0].records.size(), 1u);
  r->Complete(r->Issue(OpKind::kAllReduce, 1, DType::kF32, 4), true);
  EXPECT_EQ(r->Snapshot().size(), 2u);
}

TEST(FlightDump, BadFilesAreErrorsNamingThem) {
  auto bad = [](const std::string& text) {
    auto d = ParseDump(text, "dir/rank1.pid9.jsonl");
    EXPECT_FALSE(d.ok());
    return std::string(d.status().message());
  };
  const std::string header =
      "{\"type\":\"loom_flight\",\"version\":1,\"world_rank\":1,\"pid\":9,\"host\":\"h\","
      "\"reason\":\"r\",\"dump_us\":5,\"dump_unix_us\":6,\"tick_us\":10000}\n";
  EXPECT_NE(bad("").find("dir/rank1.pid9.jsonl: empty file"), std::string::npos);
  EXPECT_NE(bad("hello\n").find("dir/rank1.pid9.jsonl:1: not a JSON object"), std::string::npos);
  EXPECT_NE(bad("{\"type\":\"comm\"}\n").find(":1: the first line"), std::string::npos);
  EXPECT_NE(bad(header + "{\"type\":\"comm\",\"comm\":0,\"group\":\"w\"").find(":2: not a JSON"),
            std::string::npos);
  EXPECT_NE(bad(header + "{\"type\":\"op\",\"comm\":0}\n").find(":2: op of comm 0 outside"),
            std::string::npos);
  const std::string comm =
      "{\"type\":\"comm\",\"comm\":0,\"group\":\"w\",\"backend\":\"ucx\",\"world_rank\":1,"
      "\"group_rank\":1,\"group_size\":2,\"members\":[0,1],\"capacity\":8,\"issued\":1}\n";
  EXPECT_NE(bad(header + comm +
                "{\"type\":\"op\",\"comm\":0,\"id\":0,\"op\":\"all_scatter\",\"seq\":0}\n")
                .find(":3: unknown op \"all_scatter\""),
            std::string::npos);
  EXPECT_NE(bad(header + comm + "{\"type\":\"op\",\"comm\":0,\"id\":0,\"op\":\"barrier\"}\n")
                .find(":3: \"seq\" is missing"),
            std::string::npos);
  EXPECT_TRUE(ParseDump(header + comm, "x").ok());

  auto missing = ReadDump("/nonexistent/rank0.pid1.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/rank0.pid1.jsonl: cannot open"),
            std::string::npos);
  const std::string empty_dir = TestDir("empty");
  mkdir(empty_dir.c_str(), 0777);
  auto none = ReadDumpDir(empty_dir);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("holds no dump"), std::string::npos);
  std::ofstream(empty_dir + "/rank0.pid1.jsonl") << header << "garbage\n";
  auto garbage = ReadDumpDir(empty_dir);
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("rank0.pid1.jsonl:2: not a JSON object"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::comm::flight
