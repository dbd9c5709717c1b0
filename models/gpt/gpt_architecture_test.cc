#include "models/gpt/gpt_architecture.h"

#include <set>

#include "gtest/gtest.h"

namespace loom::layers {
namespace {

TEST(GptArchitectureTest, EveryFieldHasOneFlagAndRoundTrips) {
  std::set<absl::string_view> flags;
  for (const ArchitectureField& f : ArchitectureFields()) {
    EXPECT_TRUE(flags.insert(f.flag).second) << f.flag;
    EXPECT_FALSE(f.help.empty()) << f.flag;
    EXPECT_EQ(FindArchitectureField(f.dashed()), &f);
    EXPECT_EQ(FindArchitectureField(f.flag), &f);
    // set(get(a)) leaves a unchanged; setting another value is read back.
    GptArchitecture a;
    const FieldValue v = f.get(a);
    ASSERT_TRUE(f.set(a, v).ok()) << f.flag;
    EXPECT_EQ(f.get(a), v) << f.flag;
    const FieldValue other = DifferentValue(f, v);
    ASSERT_NE(other, v) << f.flag;
    ASSERT_TRUE(f.set(a, other).ok()) << f.flag;
    EXPECT_EQ(f.get(a), other) << f.flag;
  }
  EXPECT_EQ(FindArchitectureField("--no-such-flag"), nullptr);
}

// An enum field reads and writes its spelling; an unknown one is refused
// naming the field and the choices, leaving the member as it was.
TEST(GptArchitectureTest, EnumFieldsTravelAsTheirSpellings) {
  const ArchitectureField* f = FindArchitectureField("--normalization");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->choices, (std::vector<std::string>{"LayerNorm", "RMSNorm"}));
  GptArchitecture a;
  EXPECT_EQ(f->get(a), FieldValue(std::string("LayerNorm")));
  ASSERT_TRUE(f->set(a, FieldValue(std::string("RMSNorm"))).ok());
  EXPECT_TRUE(a.rms_norm());
  const absl::Status bad = f->set(a, FieldValue(std::string("rmsnorm")));
  EXPECT_EQ(bad.message(), "normalization is 'rmsnorm'; expected one of LayerNorm | RMSNorm");
  EXPECT_EQ(a.normalization, Normalization::kRMSNorm);
  EXPECT_EQ(FindArchitectureField("position_embedding_type")->choices,
            (std::vector<std::string>{"learned_absolute", "rope"}));
  EXPECT_TRUE(FindArchitectureField("num_layers")->choices.empty());
}

TEST(GptArchitectureTest, NegatedFlagReadsInTheFlagsSense) {
  const ArchitectureField* f = FindArchitectureField("--disable-bias-linear");
  ASSERT_NE(f, nullptr);
  GptArchitecture a;
  EXPECT_EQ(f->get(a), FieldValue(false));  // biases by default
  ASSERT_TRUE(f->set(a, FieldValue(true)).ok());
  EXPECT_FALSE(a.add_bias_linear);
  EXPECT_FALSE(a.qkv_bias());
  a.add_qkv_bias = true;
  EXPECT_TRUE(a.qkv_bias());
}

TEST(GptArchitectureTest, DefiningValuesResolveDefaultsAndComparedValuesIgnoreWhatDoesNotApply) {
  GptArchitecture a;
  a.hidden_size = 96;
  a.seq_length = 48;
  EXPECT_EQ(FindArchitectureField("ffn_hidden_size")->defining(a), FieldValue(int64_t{384}));
  EXPECT_EQ(FindArchitectureField("ffn_hidden_size")->get(a), FieldValue(int64_t{0}));
  EXPECT_EQ(FindArchitectureField("max_position_embeddings")->defining(a), FieldValue(int64_t{48}));

  // RoPE's base matters only with rope; MoE routing only with experts.
  const ArchitectureField* base = FindArchitectureField("rotary_base");
  EXPECT_EQ(ComparedValue(*base, a), FieldValue(0.0f));
  a.position_embedding_type = PositionEmbedding::kRope;
  EXPECT_EQ(ComparedValue(*base, a), FieldValue(10000.0f));
  const ArchitectureField* topk = FindArchitectureField("moe_router_topk");
  EXPECT_EQ(ComparedValue(*topk, a), FieldValue(int64_t{0}));
  a.num_experts = 4;
  EXPECT_EQ(ComparedValue(*topk, a), FieldValue(int64_t{2}));

  EXPECT_FALSE(FindArchitectureField("make_vocab_size_divisible_by")->compared);
  EXPECT_TRUE(FindArchitectureField("hidden_size")->compared);
  EXPECT_EQ(FieldValueString(FieldValue(1e-5f)), "1e-05");
  EXPECT_EQ(FieldValueString(FieldValue(1e6f)), "1000000");
  EXPECT_EQ(FieldValueString(FieldValue(1.2345678e-6f)), "1.2345678e-06");
  EXPECT_EQ(FieldValueString(FieldValue(0.5f)), "0.5");
  EXPECT_EQ(FieldValueString(FieldValue(true)), "true");
}

}  // namespace
}  // namespace loom::layers
