// CheckpointReader::ReadMany over shard files larger than one thread's 32 MiB
// range, with any number of reader threads: the same bytes as Read(), and a
// damaged file is caught whichever thread read the damage.
#include "checkpoint/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "checkpoint/writer.h"
#include "gtest/gtest.h"

namespace loom::checkpoint {
namespace {

constexpr int64_t kRows = 2200, kCols = 4096;  // 36 MiB of f32
constexpr int64_t kSplit = 2100;                // file 0: rows [0, 2100) = 34 MiB

float Value(int64_t row, int64_t col) { return static_cast<float>(row * 7 + col % 1000); }

// A checkpoint of one [kRows, kCols] tensor in two files (row blocks).
std::string WriteCheckpoint(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_TRUE(BeginCheckpoint(dir, 1).ok());
  std::vector<float> data(static_cast<size_t>(kRows * kCols));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) data[r * kCols + c] = Value(r, c);
  }
  std::vector<ShardReport> reports;
  const int64_t starts[2] = {0, kSplit}, ends[2] = {kSplit, kRows};
  for (int rank = 0; rank < 2; ++rank) {
    Piece p{"w", PARAM, {kRows, kCols},
            Region::Rect(starts[rank], ends[rank] - starts[rank], 0, kCols),
            data.data() + starts[rank] * kCols};
    auto report =
        WriteShardFile(JoinPath(TmpDirFor(dir, 1), ShardFileName(rank, 2)), rank, {p});
    EXPECT_TRUE(report.ok()) << report.status();
    reports.push_back(*report);
  }
  Manifest m;
  EXPECT_TRUE(MergeReports(reports, &m).ok());
  m.set_format_version(kFormatVersion);
  m.mutable_training()->set_iteration(1);
  EXPECT_TRUE(CommitCheckpoint(dir, m, 0).ok());
  return FinalDirFor(dir, 1);
}

TEST(ReaderTest, ReadManyGivesTheSameBytesWithAnyNumberOfThreads) {
  const std::string path = WriteCheckpoint("threads");
  for (int threads : {0, 1, 2, 5}) {
    ReaderOptions o;
    o.read_threads = threads;
    auto reader = CheckpointReader::Open(path, o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    // Whole rows (read straight from the files) and a column block (copied
    // from the verified mapping), in one batch.
    std::vector<float> all(static_cast<size_t>(kRows * kCols), -1.0f);
    std::vector<float> block(static_cast<size_t>(kRows * 3), -1.0f);
    ASSERT_TRUE((*reader)
                    ->ReadMany({{"w", PARAM, Region::Rect(0, kRows, 0, kCols), all.data()},
                                {"w", PARAM, Region::Rect(0, kRows, 100, 3), block.data()}})
                    .ok());
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) {
        ASSERT_EQ(all[r * kCols + c], Value(r, c)) << "threads " << threads << " " << r << "," << c;
      }
      for (int64_t c = 0; c < 3; ++c) ASSERT_EQ(block[r * 3 + c], Value(r, 100 + c));
    }
  }
}

TEST(ReaderTest, DamagePastTheFirstRangeIsCaught) {
  const std::string path = WriteCheckpoint("damaged");
  // Flip a byte 32.5 MiB into file 0 (32.8 MiB): in its second 32 MiB range.
  const off_t at = (32 << 20) + (1 << 19);
  const std::string file = JoinPath(path, ShardFileName(0, 2));
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, at), 1);
  b ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
  ::close(fd);
  for (int threads : {1, 3}) {
    ReaderOptions o;
    o.read_threads = threads;
    auto reader = CheckpointReader::Open(path, o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<float> all(static_cast<size_t>(kRows * kCols));
    absl::Status s =
        (*reader)->ReadMany({{"w", PARAM, Region::Rect(0, kRows, 0, kCols), all.data()}});
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace loom::checkpoint
