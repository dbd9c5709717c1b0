#include "train/default_data.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "train/data/byte_tokenizer.h"
#include "train/data/gpt_dataset.h"
#include "train/data/indexed_dataset.h"

namespace loom::train {
namespace {

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

// A fortunes folder with two fortunes, an index file and a sub-folder (skipped).
std::string MakeFortunes(const std::string& name) {
  const std::string dir = Tmp(name);
  std::filesystem::create_directories(dir + "/off");
  std::ofstream(dir + "/wisdom") << "Be kind.\n%\nBe brief.\n%\n";
  std::ofstream(dir + "/wisdom.dat") << "binary index";
  std::ofstream(dir + "/off/rude") << "skipped\n%\n";
  return dir;
}

TEST(DefaultDataTest, PreparesOnceFromFortuneFiles) {
  const std::string dir = MakeFortunes("fortunes");
  auto files = FortuneFiles(dir);
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 1u);

  ByteTokenizer bytes;
  const std::string cache = Tmp("cache");
  auto prefix = PrepareDefaultData(cache, bytes, "byte", dir);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  auto ds = IndexedDataset::Open(*prefix);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->num_documents(), 2u);
  EXPECT_EQ((*ds)->sequence_length(0), 10);  // "Be kind.\n" + EOD
  // A second call reuses the cache even if the source is gone.
  std::remove((dir + "/wisdom").c_str());
  EXPECT_TRUE(PrepareDefaultData(cache, bytes, "byte", dir).ok());
}

// Two tokenizers of one --tokenizer-type (say two tokenizer.json files) must
// not share a cached corpus: the ids of one are wrong for the other.
TEST(DefaultDataTest, TokenizersOfOneTypeDoNotShareTheCache) {
  const std::string dir = MakeFortunes("fortunes_two_tokenizers");
  const std::string cache = Tmp("cache_two_tokenizers");
  ByteTokenizer bytes;
  // The same byte tokenizer with its ids shifted by one: another vocabulary.
  class Shifted : public ByteTokenizer {
   public:
    std::vector<int32_t> Encode(const std::string& text) const override {
      std::vector<int32_t> ids = ByteTokenizer::Encode(text);
      for (int32_t& id : ids) id = (id + 1) % 256;
      return ids;
    }
  } shifted;
  EXPECT_EQ(TokenizerFingerprint(bytes), TokenizerFingerprint(bytes));
  EXPECT_NE(TokenizerFingerprint(bytes), TokenizerFingerprint(shifted));
  auto a = PrepareDefaultData(cache, bytes, "byte", dir);
  auto b = PrepareDefaultData(cache, shifted, "byte", dir);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

// A --data-cache-dir that does not exist yet, with a quote and a space in its
// name and missing parents, is created (no shell is involved) by both users:
// the default corpus and the sample-index cache of any --data-path.
TEST(DefaultDataTest, NewCacheFolderWithAQuoteAndASpaceIsCreated) {
  const std::string dir = MakeFortunes("fortunes2");
  ByteTokenizer bytes;
  const std::string cache = Tmp("x y'z/new/dir");
  ASSERT_FALSE(std::filesystem::exists(Tmp("x y'z")));
  auto prefix = PrepareDefaultData(cache, bytes, "byte", dir);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_TRUE(std::filesystem::is_directory(cache));
  EXPECT_EQ(*prefix, cache + "/fortunes_byte_" + TokenizerFingerprint(bytes));

  auto ds = IndexedDataset::Open(*prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  GptDatasetOptions o;
  o.seq_length = 4;
  o.num_samples = 3;
  o.documents = {0, 2};
  o.cache_dir = Tmp("a b'c/sample \"index\"/cache");
  auto samples = GptDataset::Build(ds->get(), o);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_FALSE((*samples)->loaded_from_cache());
  samples = GptDataset::Build(ds->get(), o);  // written there the first time
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_TRUE((*samples)->loaded_from_cache());
}

TEST(DefaultDataTest, UncreatableCacheFolderNamesTheFlag) {
  const std::string file = Tmp("plain_file");
  std::ofstream(file) << "not a folder";
  absl::Status s = MakeCacheDir(file + "/sub");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--data-cache-dir"), std::string::npos) << s;
  s = MakeCacheDir(file);
  EXPECT_FALSE(s.ok());
}

TEST(DefaultDataTest, MissingCorpusSaysHowToGetIt) {
  auto files = FortuneFiles("/nonexistent/fortunes");
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("tools/setup.sh"), std::string::npos);
  EXPECT_NE(files.status().message().find("--data-path"), std::string::npos);
}

}  // namespace
}  // namespace loom::train
