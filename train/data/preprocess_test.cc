#include "train/data/preprocess.h"

#include <fstream>

#include "gtest/gtest.h"
#include "train/data/byte_tokenizer.h"
#include "train/data/indexed_dataset.h"

namespace loom::train {
namespace {

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

std::vector<int32_t> Tokens(const IndexedDataset& ds, size_t seq) {
  std::vector<int32_t> t(ds.sequence_length(seq));
  EXPECT_TRUE(ds.Read(seq, 0, t.size(), t.data()).ok());
  return t;
}

TEST(PreprocessTest, FortuneStyleTextSplitsOnSeparator) {
  std::ofstream(Tmp("f.txt")) << "ab\n%\ncd\nef\n%\n";
  PreprocessOptions o;
  o.inputs = {Tmp("f.txt")};
  o.output_prefix = Tmp("fortune");
  o.document_separator = "%";
  ByteTokenizer bytes;
  int64_t last_done = -1;
  auto stats = Preprocess(o, bytes, [&](int64_t done, int64_t total) { last_done = done; });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 2);
  EXPECT_EQ(stats->tokens, 3 + 6);
  EXPECT_EQ(last_done, 13);  // all bytes of the file
  auto ds = IndexedDataset::Open(Tmp("fortune"));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->token_type(), TokenType::kU16);
  EXPECT_EQ(bytes.Decode(Tokens(**ds, 1)), "cd\nef\n");
}

TEST(PreprocessTest, JsonLinesWithEod) {
  std::ofstream(Tmp("d.jsonl")) << "{\"text\": \"hi\"}\n\n{\"text\": \"yo!\", \"id\": 3}\n";
  PreprocessOptions o;
  o.inputs = {Tmp("d.jsonl")};
  o.output_prefix = Tmp("jsonl");
  o.append_eod = true;
  ByteTokenizer bytes;
  auto stats = Preprocess(o, bytes);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto ds = IndexedDataset::Open(Tmp("jsonl"));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(Tokens(**ds, 0), (std::vector<int32_t>{'h', 'i', 0}));
  EXPECT_EQ((*ds)->num_documents(), 2u);
}

TEST(PreprocessTest, BadJsonNamesFileAndLine) {
  std::ofstream(Tmp("bad.jsonl")) << "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n";
  PreprocessOptions o;
  o.inputs = {Tmp("bad.jsonl")};
  o.output_prefix = Tmp("bad");
  ByteTokenizer bytes;
  auto stats = Preprocess(o, bytes);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("bad.jsonl:2"), std::string::npos);
  EXPECT_NE(stats.status().message().find("--json-keys"), std::string::npos);
  // Nothing half-written is left behind.
  EXPECT_FALSE(std::ifstream(Tmp("bad.idx")).good());
  EXPECT_FALSE(std::ifstream(Tmp("bad.bin")).good());
}

TEST(PreprocessTest, MissingInputIsAnError) {
  PreprocessOptions o;
  o.inputs = {Tmp("nope.txt")};
  o.output_prefix = Tmp("x");
  ByteTokenizer bytes;
  auto stats = Preprocess(o, bytes);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("nope.txt"), std::string::npos);
}

}  // namespace
}  // namespace loom::train
