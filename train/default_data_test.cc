#include "train/default_data.h"

#include <fstream>

#include "gtest/gtest.h"
#include "train/data/byte_tokenizer.h"
#include "train/data/indexed_dataset.h"

namespace loom::train {
namespace {

TEST(DefaultDataTest, PreparesOnceFromFortuneFiles) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/fortunes";
  ASSERT_EQ(std::system(("mkdir -p " + dir + "/off").c_str()), 0);
  std::ofstream(dir + "/wisdom") << "Be kind.\n%\nBe brief.\n%\n";
  std::ofstream(dir + "/wisdom.dat") << "binary index";
  std::ofstream(dir + "/off/rude") << "skipped\n%\n";
  auto files = FortuneFiles(dir);
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 1u);

  ByteTokenizer bytes;
  const std::string cache = std::string(getenv("TEST_TMPDIR")) + "/cache";
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

TEST(DefaultDataTest, MissingCorpusSaysHowToGetIt) {
  auto files = FortuneFiles("/nonexistent/fortunes");
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("tools/setup.sh"), std::string::npos);
  EXPECT_NE(files.status().message().find("--data-path"), std::string::npos);
}

}  // namespace
}  // namespace loom::train
