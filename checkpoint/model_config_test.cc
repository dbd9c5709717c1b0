#include "checkpoint/model_config.h"

#include "gtest/gtest.h"
#include "models/gpt/gpt_architecture.h"

namespace loom::checkpoint {
namespace {

using google::protobuf::FieldDescriptor;
using layers::ArchitectureField;
using layers::FieldValue;

// Every field applies: rope, GQA, experts.
layers::GptConfig EveryFieldApplies() {
  layers::GptConfig c;
  c.num_layers = 3;
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.ffn_hidden_size = 80;  // explicit: a derived width would change with --swiglu
  c.max_position_embeddings = 64;
  c.normalization = layers::Normalization::kRMSNorm;
  c.position_embedding_type = layers::PositionEmbedding::kRope;
  c.rotary_base = 500000.0f;
  c.rotary_percent = 0.5f;
  c.swiglu = true;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = true;
  c.num_experts = 4;
  c.moe_router_topk = 1;
  c.moe_layer_freq = 2;
  c.make_vocab_size_divisible_by = 64;
  c.layernorm_epsilon = 1e-6f;
  c.vocab_size = 1000;
  return c;
}

TEST(ModelConfigTest, EveryArchitectureFieldHasAManifestFieldOfItsType) {
  for (const ArchitectureField& f : layers::ArchitectureFields()) {
    const FieldDescriptor* d =
        ModelConfig::descriptor()->FindFieldByName(std::string(f.flag.data(), f.flag.size()));
    ASSERT_NE(d, nullptr) << "checkpoint.proto: ModelConfig needs a field " << f.flag;
    const FieldDescriptor::CppType want = std::visit(
        [](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, int64_t>) return FieldDescriptor::CPPTYPE_INT64;
          else if constexpr (std::is_same_v<T, float>) return FieldDescriptor::CPPTYPE_FLOAT;
          else if constexpr (std::is_same_v<T, bool>) return FieldDescriptor::CPPTYPE_BOOL;
          else return FieldDescriptor::CPPTYPE_STRING;
        },
        f.get(layers::GptConfig{}));
    EXPECT_EQ(d->cpp_type(), want) << f.flag;
  }
}

TEST(ModelConfigTest, RoundTripsEveryField) {
  const layers::GptConfig c = EveryFieldApplies();
  const ModelConfig m = ModelConfigProto(c);
  absl::StatusOr<layers::GptConfig> read = GptConfigFromProto(m, "m");
  ASSERT_TRUE(read.ok()) << read.status();
  const layers::GptConfig& back = *read;
  for (const ArchitectureField& f : layers::ArchitectureFields()) {
    EXPECT_EQ(f.defining(back), f.defining(c)) << f.flag;
  }
  EXPECT_EQ(back.vocab_size, 1000);
  // Stored by the flag's name: --disable-bias-linear, and the effective FFN width.
  EXPECT_TRUE(m.disable_bias_linear());
  EXPECT_EQ(m.ffn_hidden_size(), c.ffn());
  EXPECT_TRUE(CheckModelConfig(m, c, "ck").ok());
}

// A manifest written before the Llama-style fields existed holds none of
// them: it reads back as GPT-2.
TEST(ModelConfigTest, AbsentFieldsReadAsGpt2) {
  ModelConfig old;
  old.set_num_layers(2);
  old.set_hidden_size(64);
  old.set_num_attention_heads(4);
  old.set_ffn_hidden_size(256);
  old.set_seq_length(32);
  old.set_max_position_embeddings(32);
  old.set_vocab_size(256);
  absl::StatusOr<layers::GptConfig> read = GptConfigFromProto(old, "old");
  ASSERT_TRUE(read.ok()) << read.status();
  const layers::GptConfig& c = *read;
  EXPECT_EQ(c.normalization, layers::Normalization::kLayerNorm);
  EXPECT_EQ(c.position_embedding_type, layers::PositionEmbedding::kLearnedAbsolute);
  EXPECT_EQ(c.rotary_base, 10000.0f);
  EXPECT_TRUE(c.add_bias_linear);
  EXPECT_FALSE(c.add_qkv_bias);
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_EQ(c.moe_router_topk, 2);
  EXPECT_TRUE(CheckModelConfig(old, layers::GptConfig{}, "ck").ok());
}

// An enum field holding a spelling Loom does not know (a manifest from a
// newer Loom, or edited by hand) is refused naming the field, the file and
// the choices, not read as some default.
TEST(ModelConfigTest, UnknownEnumSpellingIsRefused) {
  ModelConfig m = ModelConfigProto(layers::GptConfig{});
  m.set_normalization("ScaleNorm");
  absl::StatusOr<layers::GptConfig> c = GptConfigFromProto(m, "/ck/iter_0000002/manifest.pb");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "/ck/iter_0000002/manifest.pb: model field normalization is 'ScaleNorm'; expected one "
            "of LayerNorm | RMSNorm");
  const absl::Status s = CheckModelConfig(m, layers::GptConfig{}, "/ck/iter_0000002");
  EXPECT_NE(s.message().find("normalization is 'ScaleNorm'"), std::string::npos) << s;
}

TEST(ModelConfigTest, EveryComparedFieldThatDiffersIsNamed) {
  const layers::GptConfig saved = EveryFieldApplies();
  const ModelConfig m = ModelConfigProto(saved);
  for (const ArchitectureField& f : layers::ArchitectureFields()) {
    layers::GptConfig flags = saved;
    ASSERT_TRUE(f.set(flags, layers::DifferentValue(f, f.get(flags))).ok()) << f.flag;
    const absl::Status s = CheckModelConfig(m, flags, "/ck/iter_0000002");
    if (!f.compared) {
      EXPECT_TRUE(s.ok()) << f.flag << ": " << s;
      continue;
    }
    ASSERT_FALSE(s.ok()) << f.flag;
    EXPECT_NE(s.message().find("model config mismatch: " + f.dashed() + " is " +
                               layers::FieldValueString(f.defining(saved)) +
                               " in checkpoint /ck/iter_0000002"),
              std::string::npos)
        << s;
  }
  layers::GptConfig other_vocab = saved;
  other_vocab.vocab_size = 999;
  EXPECT_NE(CheckModelConfig(m, other_vocab, "ck").message().find("vocabulary size"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::checkpoint
