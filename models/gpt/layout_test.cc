// Layouts the flags cannot satisfy are rejected before any work, naming the
// flags and both numbers.
#include "gtest/gtest.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

void ExpectError(const absl::Status& s, const std::vector<std::string>& parts) {
  ASSERT_FALSE(s.ok());
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << s.message() << " lacks " << p;
  }
}

TEST(LayoutTest, RejectsIndivisibleLayouts) {
  GptConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 30;
  EXPECT_TRUE(ValidateLayout(c, 2, false).ok());
  EXPECT_TRUE(ValidateLayout(c, 2, true).ok());
  ExpectError(ValidateLayout(c, 3, false), {"--num-attention-heads (4)", "--tensor-model-parallel-size (3)"});
  ExpectError(ValidateLayout(c, 4, true), {"--seq-length (30)", "--sequence-parallel", "(4)"});
  c.num_attention_heads = 5;
  ExpectError(ValidateLayout(c, 1, false), {"--hidden-size (64)", "--num-attention-heads (5)"});
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 70;
  ExpectError(ValidateLayout(c, 4, false), {"--ffn-hidden-size (70)", "(4)"});
  c.ffn_hidden_size = 0;
  c.num_layers = 3;
  ExpectError(ValidateLayout(c, 1, false, 2), {"--num-layers (3)", "--pipeline-model-parallel-size"});
  c.num_layers = 2;
  c.max_position_embeddings = 16;
  ExpectError(ValidateLayout(c, 1, false), {"--max-position-embeddings (16)", "--seq-length (30)"});
}

TEST(LayoutTest, RejectsLlamaOptionsThatCannotWork) {
  GptConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  EXPECT_TRUE(ValidateLayout(c, 2, true).ok());
  ExpectError(ValidateLayout(c, 4, false),
              {"--num-query-groups (2)", "--tensor-model-parallel-size (4)"});
  c.num_query_groups = 3;
  ExpectError(ValidateLayout(c, 1, false), {"--num-attention-heads (4)", "--num-query-groups (3)"});
  c.num_query_groups = 8;
  ExpectError(ValidateLayout(c, 1, false), {"--num-query-groups (8)", "--num-attention-heads (4)"});
  c.num_query_groups = 2;
  c.normalization = layers::Normalization::kRMSNorm;
  c.position_embedding_type = layers::PositionEmbedding::kRope;
  c.rotary_percent = 0.1f;  // 16 x 0.1 -> 1 dim
  ExpectError(ValidateLayout(c, 1, false), {"--rotary-percent (0.1)", "head dim", "= 16)"});
  c.rotary_percent = 0.25f;  // 4 dims
  EXPECT_TRUE(ValidateLayout(c, 2, false).ok());
  // Megatron's --swiglu default ffn: int(4 x 64 x 2/3 / 64) x 64 = 128.
  c.swiglu = true;
  EXPECT_EQ(c.ffn(), 128);
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.rotary_percent = 1.0f;
  ExpectError(ValidateLayout(c, 1, false), {"--ffn-hidden-size", "--swiglu"});
}

TEST(LayoutTest, ModelCreationValidatesBeforeAnyWork) {
  GptConfig c;
  c.num_attention_heads = 3;
  c.hidden_size = 48;
  absl::Status s = testing::RunRanks(2, [&](int, comm::Communicator* comm) -> absl::Status {
    auto m = GptModel::Create(c, TpGroup{comm, false});
    ExpectError(m.status(), {"--num-attention-heads (3)", "--tensor-model-parallel-size (2)"});
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace loom::layers
