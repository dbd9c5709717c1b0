// LtorMasksAndPositionIds against Megatron-Core's own function
// (testdata/megatron_packing/masks.json, made by
// tools/megatron_reference/make_reference.sh) and a hand-worked sample.

#include "train/data/packing.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::train {
namespace {

nlohmann::json Reference() {
  const std::string path = std::string(std::getenv("TEST_SRCDIR")) + "/" +
                           std::getenv("TEST_WORKSPACE") +
                           "/train/data/testdata/megatron_packing/masks.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(PackingTest, MatchesMegatronCore) {
  const nlohmann::json reference = Reference();
  ASSERT_EQ(reference["cases"].size(), 20u);
  for (const nlohmann::json& c : reference["cases"]) {
    const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    PackingOptions o;
    o.eod = c["eod"].get<int32_t>();
    o.reset_position_ids = c["reset_position_ids"].get<bool>();
    o.reset_attention_mask = c["reset_attention_mask"].get<bool>();
    o.eod_mask_loss = c["eod_mask_loss"].get<bool>();
    SCOPED_TRACE(c.dump().substr(0, 120));
    const SampleMasks m = LtorMasksAndPositionIds(tokens.data(), tokens.size(), o);
    EXPECT_EQ(m.position, c["position_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(m.loss_mask, c["loss_mask"].get<std::vector<float>>());
    const auto mask = c["attention_mask"].get<std::vector<std::vector<int>>>();
    const int64_t n = tokens.size();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const bool attends = m.doc_start[i] <= j && j <= i;
        EXPECT_EQ(attends, mask[i][j] == 0) << "query " << i << ", key " << j;
      }
    }
  }
}

// Worked by hand from Megatron's loop: EODs at 2 and 5 end the documents
// [0, 2] and [3, 5]; [6, 7] is the third.
TEST(PackingTest, HandWorkedSample) {
  const std::vector<int32_t> tokens = {4, 4, 9, 4, 4, 9, 4, 4};
  const SampleMasks m = LtorMasksAndPositionIds(tokens.data(), tokens.size(), {9, true, true, true});
  EXPECT_EQ(m.position, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1}));
  EXPECT_EQ(m.doc_start, (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 6, 6}));
  EXPECT_EQ(m.loss_mask, (std::vector<float>{1, 1, 0, 1, 1, 0, 1, 1}));
  // The switches are independent: positions alone leave the mask causal.
  const SampleMasks p = LtorMasksAndPositionIds(tokens.data(), tokens.size(), {9, true, false, false});
  EXPECT_EQ(p.position, m.position);
  EXPECT_EQ(p.doc_start, (std::vector<int32_t>(8, 0)));
  EXPECT_EQ(p.loss_mask, (std::vector<float>(8, 1.0f)));
}

}  // namespace
}  // namespace loom::train
