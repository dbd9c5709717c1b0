#include "train/data/gpt_dataset.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace loom::train {
namespace {

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

// Document d holds tokens d*1000 + 0, 1, ..., lengths[d]-1.
std::unique_ptr<IndexedDataset> MakeDocs(const std::string& name, const std::vector<int>& lengths) {
  auto w = IndexedDatasetWriter::Create(Tmp(name), TokenType::kI32);
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int32_t> t(lengths[d]);
    for (int k = 0; k < lengths[d]; ++k) t[k] = static_cast<int32_t>(d * 1000 + k);
    EXPECT_TRUE((*w)->AddSequence(t.data(), t.size()).ok());
    EXPECT_TRUE((*w)->EndDocument().ok());
  }
  EXPECT_TRUE((*w)->Finalize().ok());
  return *IndexedDataset::Open(Tmp(name));
}

std::vector<std::vector<int32_t>> AllSamples(const GptDataset& ds) {
  std::vector<std::vector<int32_t>> out(ds.num_samples(), std::vector<int32_t>(ds.seq_length() + 1));
  for (int64_t i = 0; i < ds.num_samples(); ++i) EXPECT_TRUE(ds.Sample(i, out[i].data()).ok());
  return out;
}

TEST(SplitDocumentsTest, MegatronBoundaries) {
  auto r = SplitDocuments("969,30,1", 1000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].begin, 0);
  EXPECT_EQ((*r)[0].end, 969);
  EXPECT_EQ((*r)[1].end, 999);
  EXPECT_EQ((*r)[2].end, 1000);
  auto two = SplitDocuments("90,10", 10);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ((*two)[0].end, 9);
  EXPECT_EQ((*two)[1].end, 10);
  EXPECT_EQ((*two)[2].begin, (*two)[2].end);
  EXPECT_FALSE(SplitDocuments("a,b", 10).ok());
  auto zero = SplitDocuments("0,0,0", 10);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("--split=0,0,0"), std::string::npos);
}

TEST(GptDatasetTest, SingleDocumentSamplesAreOverlappingWindows) {
  auto data = MakeDocs("single", {11});  // tokens 0..10, repeated over epochs
  GptDatasetOptions o;
  o.seq_length = 4;
  o.num_samples = 7;  // needs 7*4+1 = 29 tokens -> 3 epochs
  o.documents = {0, 1};
  auto ds = GptDataset::Build(data.get(), o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->epochs(), 3);
  std::set<int64_t> windows;
  for (const auto& s : AllSamples(**ds)) {
    // Sample = stream[j*4 .. j*4+4] with stream[t] = t % 11, for some j.
    int64_t found = -1;
    for (int64_t j = 0; j < 7; ++j) {
      bool match = true;
      for (int u = 0; u <= 4; ++u) match &= s[u] == (j * 4 + u) % 11;
      if (match) found = j;
    }
    ASSERT_GE(found, 0);
    windows.insert(found);
  }
  EXPECT_EQ(windows.size(), 7u);  // a permutation of all windows
}

TEST(GptDatasetTest, SamplesCrossDocumentBoundariesOnly) {
  auto data = MakeDocs("multi", {5, 3, 8, 1, 6});
  GptDatasetOptions o;
  o.seq_length = 6;
  o.num_samples = 20;
  o.documents = {0, 5};
  o.seed = 7;
  auto ds = GptDataset::Build(data.get(), o);
  ASSERT_TRUE(ds.ok());
  const int lengths[] = {5, 3, 8, 1, 6};
  for (const auto& s : AllSamples(**ds)) {
    for (int u = 0; u + 1 < 7; ++u) {
      int doc = s[u] / 1000, k = s[u] % 1000;
      bool next_in_doc = s[u + 1] == s[u] + 1;
      bool jump = k == lengths[doc] - 1 && s[u + 1] % 1000 == 0;
      EXPECT_TRUE(next_in_doc || jump) << s[u] << " -> " << s[u + 1];
    }
  }
}

TEST(GptDatasetTest, SeedDeterminesOrderAndCacheReproducesIt) {
  auto data = MakeDocs("seeded", {7, 9, 4, 11, 5, 6});
  GptDatasetOptions o;
  o.seq_length = 5;
  o.num_samples = 12;
  o.documents = {0, 6};
  o.cache_dir = getenv("TEST_TMPDIR");
  auto a = GptDataset::Build(data.get(), o);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE((*a)->loaded_from_cache());
  auto b = GptDataset::Build(data.get(), o);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE((*b)->loaded_from_cache());
  EXPECT_EQ(AllSamples(**a), AllSamples(**b));
  o.seed = 99;
  auto c = GptDataset::Build(data.get(), o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(AllSamples(**a), AllSamples(**c));
}

TEST(GptDatasetTest, EmptySplitIsAClearError) {
  auto data = MakeDocs("empty", {4, 4});
  GptDatasetOptions o;
  o.num_samples = 3;
  o.documents = {1, 1};
  o.name = "valid";
  auto ds = GptDataset::Build(data.get(), o);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("valid split"), std::string::npos);
  o.documents = {0, 3};
  EXPECT_FALSE(GptDataset::Build(data.get(), o).ok());
}

TEST(SampleIndexForTest, GlobalBatchIsTheSameSetForAnyDpSize) {
  // Global batch 8 = micro 2 x (4 micro-batches x DP 1) = micro 2 x (2 x DP 2) ...
  for (int dp : {1, 2, 4}) {
    const int mbs = 2, micro_batches = 8 / (mbs * dp);
    std::multiset<int64_t> seen;
    for (int r = 0; r < dp; ++r)
      for (int m = 0; m < micro_batches; ++m)
        for (int row = 0; row < mbs; ++row) seen.insert(SampleIndexFor(16, m, mbs, r, dp, row));
    std::multiset<int64_t> expected;
    for (int i = 16; i < 24; ++i) expected.insert(i);
    EXPECT_EQ(seen, expected) << "dp=" << dp;
  }
}

}  // namespace
}  // namespace loom::train
