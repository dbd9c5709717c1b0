// Uses //models/gpt from another workspace: a small GPT's forward and backward.
#include <cmath>

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

TEST(EmbedTest, GptModelTrainsAStepFromAnotherWorkspace) {
  loom::layers::GptConfig c;
  c.num_layers = 1;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 4;
  c.vocab_size = 10;
  auto model = loom::layers::GptModel::Create(c, loom::layers::TpGroup{});
  ASSERT_TRUE(model.ok()) << model.status();
  auto ids = loom::core::Tensor::Zeros(loom::core::Shape{4, 1}, loom::core::DType::kI32);
  loom::layers::GptModel::Saved saved;
  double loss = 0;
  ASSERT_TRUE((*model)->Forward(0, *ids, *ids, {}, &saved, &loss).ok());
  EXPECT_NEAR(loss, std::log(10.0), 0.5);  // near-uniform predictions at init
  ASSERT_TRUE((*model)->Backward(0, loom::core::Tensor(), 1.0f, {}, saved).ok());
}
