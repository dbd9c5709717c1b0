#include "train/data/indexed_dataset.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::train {
namespace {

std::string TempPrefix(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Two documents: {5, 6, 7} and {8} + {9, 65535} (the second has 2 sequences).
std::string WriteSample(const std::string& name, TokenType type = TokenType::kU16) {
  std::string prefix = TempPrefix(name);
  auto w = IndexedDatasetWriter::Create(prefix, type);
  EXPECT_TRUE(w.ok()) << w.status();
  std::vector<int32_t> a = {5, 6, 7}, b = {8}, c = {9, type == TokenType::kU16 ? 65535 : 70000};
  EXPECT_TRUE((*w)->AddSequence(a.data(), a.size()).ok());
  EXPECT_TRUE((*w)->EndDocument().ok());
  EXPECT_TRUE((*w)->AddSequence(b.data(), b.size()).ok());
  EXPECT_TRUE((*w)->AddSequence(c.data(), c.size()).ok());
  EXPECT_TRUE((*w)->Finalize().ok());
  return prefix;
}

TEST(IndexedDatasetTest, ByteLayoutMatchesMegatron) {
  std::string prefix = WriteSample("layout");
  // Expected .idx, written field by field from the spec.
  std::string e("MMIDIDX\0\0", 9);
  auto put = [&e](const void* p, size_t n) { e.append(static_cast<const char*>(p), n); };
  uint64_t version = 1, s = 3, d = 3;
  uint8_t code = 8;  // u16
  put(&version, 8);
  put(&code, 1);
  put(&s, 8);
  put(&d, 8);
  int32_t lengths[] = {3, 1, 2};
  int64_t offsets[] = {0, 6, 8};
  int64_t docs[] = {0, 1, 3};
  put(lengths, sizeof(lengths));
  put(offsets, sizeof(offsets));
  put(docs, sizeof(docs));
  EXPECT_EQ(ReadAll(prefix + ".idx"), e);
  std::string bin = ReadAll(prefix + ".bin");
  ASSERT_EQ(bin.size(), 12u);
  EXPECT_EQ(static_cast<uint8_t>(bin[10]), 0xff);
  EXPECT_EQ(static_cast<uint8_t>(bin[0]), 5);
}

// The lengths-only entry point (the blend bench's synthetic corpora) writes
// the same bytes as the streaming writer for the same sequences.
TEST(IndexedDatasetTest, WriteIndexFileEqualsTheWritersIndex) {
  const std::string streamed = WriteSample("streamed");
  const std::string direct = TempPrefix("direct");
  ASSERT_TRUE(WriteIndexFile(direct, TokenType::kU16, {3, 1, 2}, {0, 1, 3}).ok());
  EXPECT_EQ(ReadAll(direct + ".idx"), ReadAll(streamed + ".idx"));
  const absl::Status bad = WriteIndexFile(TempPrefix("bad"), TokenType::kU16, {3, 1}, {0, 1});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("from 0 to the 2 sequences"), std::string::npos) << bad;
}

TEST(IndexedDatasetTest, RoundTrip) {
  for (TokenType type : {TokenType::kU16, TokenType::kI32, TokenType::kI64}) {
    std::string prefix = WriteSample("roundtrip" + std::to_string(static_cast<int>(type)), type);
    auto ds = IndexedDataset::Open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->token_type(), type);
    EXPECT_EQ((*ds)->num_sequences(), 3u);
    EXPECT_EQ((*ds)->num_documents(), 2u);
    EXPECT_EQ((*ds)->total_tokens(), 6);
    EXPECT_EQ((*ds)->document_index(), (std::vector<int64_t>{0, 1, 3}));
    int32_t out[2];
    ASSERT_TRUE((*ds)->Read(2, 0, 2, out).ok());
    EXPECT_EQ(out[0], 9);
    EXPECT_EQ(out[1], type == TokenType::kU16 ? 65535 : 70000);
    ASSERT_TRUE((*ds)->Read(0, 1, 2, out).ok());
    EXPECT_EQ(out[0], 6);
    EXPECT_EQ(out[1], 7);
    EXPECT_FALSE((*ds)->Read(0, 2, 2, out).ok());
    EXPECT_FALSE((*ds)->Read(3, 0, 1, out).ok());
  }
}

// A user's --output-prefix=data/new_corpus/ft names a folder that does not
// exist yet: the writer makes it.
TEST(IndexedDatasetTest, NewOutputFolderIsCreated) {
  const std::string prefix = TempPrefix("new_folder/nested/corpus");
  auto w = IndexedDatasetWriter::Create(prefix, TokenType::kU16);
  ASSERT_TRUE(w.ok()) << w.status();
  int32_t t[2] = {3, 4};
  ASSERT_TRUE((*w)->AddSequence(t, 2).ok());
  ASSERT_TRUE((*w)->Finalize().ok());
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->total_tokens(), 2);
}

TEST(IndexedDatasetTest, TokenTooLargeForTypeIsAnError) {
  auto w = IndexedDatasetWriter::Create(TempPrefix("big"), TokenType::kU16);
  ASSERT_TRUE(w.ok());
  int32_t t = 70000;
  absl::Status s = (*w)->AddSequence(&t, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("70000"), std::string::npos);
}

TEST(IndexedDatasetTest, UnfinishedWriterLeavesNothing) {
  std::string prefix = TempPrefix("unfinished");
  {
    auto w = IndexedDatasetWriter::Create(prefix, TokenType::kU16);
    int32_t t = 1;
    ASSERT_TRUE((*w)->AddSequence(&t, 1).ok());
  }  // destroyed without Finalize
  EXPECT_FALSE(std::ifstream(prefix + ".bin").good());
  EXPECT_FALSE(std::ifstream(prefix + ".bin.tmp").good());
  EXPECT_FALSE(std::ifstream(prefix + ".idx").good());
}

TEST(IndexedDatasetTest, MissingFileNamesThePath) {
  auto ds = IndexedDataset::Open(TempPrefix("does_not_exist"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("does_not_exist.idx"), std::string::npos);
}

TEST(IndexedDatasetTest, CorruptIndexIsRejected) {
  std::string prefix = WriteSample("corrupt");
  std::string idx = ReadAll(prefix + ".idx");

  WriteAll(prefix + ".idx", "NOTMAGIC!" + idx.substr(9));
  auto bad_magic = IndexedDataset::Open(prefix);
  ASSERT_FALSE(bad_magic.ok());
  EXPECT_NE(bad_magic.status().message().find("magic"), std::string::npos);

  WriteAll(prefix + ".idx", idx.substr(0, idx.size() - 3));
  auto truncated = IndexedDataset::Open(prefix);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);

  std::string v2 = idx;
  v2[9] = 2;
  WriteAll(prefix + ".idx", v2);
  auto version = IndexedDataset::Open(prefix);
  ASSERT_FALSE(version.ok());
  EXPECT_NE(version.status().message().find("version 2"), std::string::npos);
}

TEST(IndexedDatasetTest, TruncatedBinIsRejected) {
  std::string prefix = WriteSample("truncbin");
  std::string bin = ReadAll(prefix + ".bin");
  WriteAll(prefix + ".bin", bin.substr(0, 9));
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("truncbin.bin"), std::string::npos);
  EXPECT_NE(ds.status().message().find("sequence 2"), std::string::npos);
}

}  // namespace
}  // namespace loom::train
