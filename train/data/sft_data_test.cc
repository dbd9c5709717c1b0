#include "train/data/sft_data.h"

#include "gtest/gtest.h"
#include "train/data/indexed_dataset.h"
#include "train/data/loss_mask.h"

namespace loom::train {
namespace {

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

// The mask of a token here is a function of the token (1 where id % 3 == 0),
// so a mask sample that is not aligned with its ids sample shows.
int32_t MaskOf(int32_t id) { return id % 3 == 0 ? 1 : 0; }

void WriteCorpus(const std::string& prefix, int documents, int salt) {
  auto ids = IndexedDatasetWriter::Create(prefix, TokenType::kU16);
  auto mask = IndexedDatasetWriter::Create(LossMaskPrefix(prefix), TokenType::kU8);
  ASSERT_TRUE(ids.ok() && mask.ok());
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> t, m;
    for (int k = 0; k < 5 + (d * 7 + salt) % 40; ++k) {
      t.push_back(1 + (d * 31 + k * 17 + salt) % 997);
      m.push_back(MaskOf(t.back()));
    }
    ASSERT_TRUE((*ids)->AddSequence(t.data(), t.size()).ok());
    ASSERT_TRUE((*ids)->EndDocument().ok());
    ASSERT_TRUE((*mask)->AddSequence(m.data(), m.size()).ok());
    ASSERT_TRUE((*mask)->EndDocument().ok());
  }
  ASSERT_TRUE((*ids)->Finalize().ok());
  ASSERT_TRUE((*mask)->Finalize().ok());
}

TEST(SftDataTest, MaskValueReplacesPrefixesKeepingWeights) {
  WriteCorpus(Tmp("one"), 3, 0);
  EXPECT_EQ(*LossMaskBlendValue("--data-path", Tmp("one")), LossMaskPrefix(Tmp("one")));
  EXPECT_EQ(*LossMaskBlendValue("--data-path", "0.30 a  0.7 b"), "0.30 a_loss_mask 0.7 b_loss_mask");
  EXPECT_EQ(*LossMaskBlendValue("--data-path", ""), "");
}

// Every sample of a shuffled two-corpus blend, train and valid: the mask
// sample is the mask of the ids sample, position for position.
TEST(SftDataTest, MaskSamplesAlignWithIdsThroughSplitsAndBlends) {
  WriteCorpus(Tmp("a"), 300, 1);
  WriteCorpus(Tmp("b"), 200, 2);
  DataSplitsOptions o;
  o.data_path = "0.3 " + Tmp("a") + " 0.7 " + Tmp("b");
  o.split = "90,10,0";
  o.seq_length = 32;
  o.seed = 7;
  o.train_samples = 200;
  o.valid_samples = 20;
  auto ids = BuildDataSplits(o);
  ASSERT_TRUE(ids.ok()) << ids.status();
  auto masks = BuildLossMaskSplits(o, *ids);
  ASSERT_TRUE(masks.ok()) << masks.status();
  int64_t ones = 0, checked = 0;
  for (auto [id_split, mask_split] : {std::pair{ids->train.get(), masks->train.get()},
                                      std::pair{ids->valid.get(), masks->valid.get()}}) {
    ASSERT_NE(id_split, nullptr);
    ASSERT_EQ(id_split->num_samples(), mask_split->num_samples());
    std::vector<int32_t> t(o.seq_length + 1), m(o.seq_length + 1);
    for (int64_t i = 0; i < id_split->num_samples(); ++i) {
      ASSERT_TRUE(id_split->SampleTokens(i, 0, t.size(), t.data()).ok());
      ASSERT_TRUE(mask_split->SampleTokens(i, 0, m.size(), m.data()).ok());
      for (size_t k = 0; k < t.size(); ++k) {
        ASSERT_EQ(m[k], MaskOf(t[k])) << "sample " << i << " token " << k;
        ones += m[k];
        ++checked;
      }
    }
  }
  EXPECT_GT(ones, checked / 5);  // both values occur
  EXPECT_LT(ones, checked / 2);
}

TEST(SftDataTest, MissingOrMismatchedMaskIsAnError) {
  WriteCorpus(Tmp("c"), 50, 3);
  DataSplitsOptions o;
  o.data_path = Tmp("c");
  o.seq_length = 16;
  o.train_samples = 10;
  auto ids = BuildDataSplits(o);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // A mask from another run (other documents).
  WriteCorpus(Tmp("other"), 40, 3);
  std::rename((LossMaskPrefix(Tmp("other")) + ".idx").c_str(), (LossMaskPrefix(Tmp("c")) + ".idx").c_str());
  std::rename((LossMaskPrefix(Tmp("other")) + ".bin").c_str(), (LossMaskPrefix(Tmp("c")) + ".bin").c_str());
  auto mismatched = BuildLossMaskSplits(o, *ids);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("has other documents or lengths than its token ids"),
            std::string::npos)
      << mismatched.status();
  std::remove((LossMaskPrefix(Tmp("c")) + ".idx").c_str());
  auto missing = BuildLossMaskSplits(o, *ids);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--sft: the loss masks"), std::string::npos)
      << missing.status();
  EXPECT_NE(missing.status().message().find("c_loss_mask"), std::string::npos) << missing.status();
}

}  // namespace
}  // namespace loom::train
