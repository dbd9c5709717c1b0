// Loom's event files: records round-trip with every CRC checked, and the
// bytes are those TensorBoard's own writer makes for the same events.

#include "train/tensorboard/events.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "gtest/gtest.h"
#include "train/tensorboard/record.h"

namespace loom::tensorboard {
namespace {

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// Written by TensorBoard's RecordWriter (tools/tensorboard_reference).
std::string ReferencePath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "loom") +
         "/train/tensorboard/testdata/reference.tfevents";
}

std::string ReadAll(const std::string& path) {
  auto bytes = checkpoint::ReadFile(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

std::string WriteSample(const std::string& name) {
  const std::string path = TmpPath(name);
  auto w = EventWriter::Create(path, 100.5);
  EXPECT_TRUE(w.ok()) << w.status();
  (*w)->AddScalar("lm loss", 2.5f, 1, 101.0);
  (*w)->AddScalar("lm loss vs samples", 2.5f, 16, 101.0);
  (*w)->AddScalar("learning-rate", 0.0f, 0, 102.0);
  EXPECT_TRUE((*w)->Flush().ok());
  return path;
}

TEST(EventsTest, RoundTrip) {
  const std::string path = WriteSample("round_trip");
  auto events = ReadEvents(path);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 4u);
  EXPECT_EQ((*events)[0].file_version(), "brain.Event:2");
  EXPECT_EQ((*events)[0].wall_time(), 100.5);
  auto scalars = ReadScalars(path);
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  ASSERT_EQ(scalars->size(), 3u);
  EXPECT_EQ((*scalars)[1].tag, "lm loss vs samples");
  EXPECT_EQ((*scalars)[1].step, 16);
  EXPECT_EQ((*scalars)[1].value, 2.5f);
  EXPECT_EQ((*scalars)[1].wall_time, 101.0);
  EXPECT_EQ((*scalars)[2].tag, "learning-rate");
  EXPECT_EQ((*scalars)[2].value, 0.0f);  // proto3 omits it: still a simple_value
}

// Every byte is covered by a CRC: flipping any bit of any byte is DataLoss.
TEST(EventsTest, EveryCorruptedByteIsCaught) {
  const std::string bytes = ReadAll(WriteSample("corrupt"));
  ASSERT_TRUE(ParseRecords(bytes, "f").ok());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit : {0, 7}) {
      std::string bad = bytes;
      bad[i] ^= static_cast<char>(1 << bit);
      auto r = ParseRecords(bad, "f");
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "byte " << i << " bit " << bit;
    }
  }
  std::string bad = bytes;
  bad[30] ^= 1;  // inside the first record's data
  EXPECT_EQ(ParseRecords(bad, "run/f").status().message(),
            "run/f: record 0 at byte 0: data CRC mismatch");
}

// A file cut anywhere but between records is DataLoss; between records the
// whole records before the cut read back.
TEST(EventsTest, TruncationIsCaught) {
  const std::string bytes = ReadAll(WriteSample("truncate"));
  auto all = ParseRecords(bytes, "f");
  ASSERT_TRUE(all.ok());
  std::vector<size_t> ends = {0};
  for (const std::string& r : *all) ends.push_back(ends.back() + r.size() + 16);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = ParseRecords(std::string_view(bytes).substr(0, n), "f");
    size_t whole = 0;
    while (whole + 1 < ends.size() && ends[whole + 1] <= n) ++whole;
    if (ends[whole] == n) {
      ASSERT_TRUE(r.ok()) << n;
      EXPECT_EQ(r->size(), whole);
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << n;
    }
  }
}

// TensorBoard's writer's file parses, and Loom writes the same bytes for its
// events: framing, masks, CRCs and the protos' encoding all agree.
TEST(EventsTest, ReproducesTensorBoardsWriter) {
  auto events = ReadEvents(ReferencePath());
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 8u);
  EXPECT_EQ((*events)[0].file_version(), kFileVersion);
  auto scalars = ReadScalars(ReferencePath());
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  ASSERT_EQ(scalars->size(), 7u);
  EXPECT_EQ((*scalars)[0].tag, "lm loss");
  EXPECT_EQ((*scalars)[0].value, 10.8125f);
  EXPECT_EQ((*scalars)[0].step, 1);
  EXPECT_EQ((*scalars)[1].tag, "lm loss vs samples");
  EXPECT_EQ((*scalars)[1].step, 8);
  EXPECT_EQ((*scalars)[2].value, 3e-4f);

  const std::string path = TmpPath("reproduced");
  {
    auto w = EventWriter::Create(path, (*events)[0].wall_time());
    ASSERT_TRUE(w.ok()) << w.status();
    for (const Scalar& s : *scalars) (*w)->AddScalar(s.tag, s.value, s.step, s.wall_time);
  }  // the destructor writes what is pending
  EXPECT_EQ(ReadAll(path), ReadAll(ReferencePath()));
}

TEST(EventsTest, OpenNamesTheFileLikeTensorBoard) {
  const std::string dir = TmpPath("runs/a/b");
  auto w = EventWriter::Open(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string name = (*w)->path().substr(dir.size() + 1);
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(EventFileName(1700000000.7, "host", 42), "events.out.tfevents.1700000000.host.42");
  auto events = ReadEvents((*w)->path());  // the first record is on disk at once
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
}

TEST(EventsTest, UnwritableFolderNamesThePath) {
  const std::string file = TmpPath("not_a_folder");
  ASSERT_TRUE(checkpoint::WriteFileDurably(file, "x").ok());
  auto w = EventWriter::Open(file + "/runs");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(file + "/runs"), std::string::npos) << w.status();
}

}  // namespace
}  // namespace loom::tensorboard
