// config.json -> Megatron options and //train:gpt flags, on configs that
// transformers saved (checkpoint/hf/testdata), and refusals of everything
// that would be a different model than Loom computes.
#include "checkpoint/hf/hf_config.h"

#include "checkpoint/file_util.h"
#include "checkpoint/hf/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::checkpoint::hf {
namespace {

using ::loom::checkpoint::hf::testing::TempDir;
using ::loom::checkpoint::hf::testing::TestData;
using ::testing::HasSubstr;
using ::testing::Not;

nlohmann::ordered_json ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return nlohmann::ordered_json::parse(text.ok() ? *text : "{}");
}

TEST(HfConfig, Gpt2Tiny) {
  const std::string path = TestData("gpt2_tiny/config.json");
  absl::StatusOr<HfModelConfig> c = ReadHfConfig(TestData("gpt2_tiny"));  // the folder
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->path, path);
  EXPECT_EQ(c->architecture, "GPT2LMHeadModel");
  EXPECT_EQ(c->model_type, "gpt2");
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_FALSE(c->group_query_attention);
  EXPECT_EQ(c->num_query_groups, 4);
  EXPECT_EQ(c->ffn_hidden_size, 128);  // n_inner null: 4 x n_embd
  EXPECT_EQ(c->vocab_size, 96);
  EXPECT_EQ(c->max_position_embeddings, 32);
  EXPECT_EQ(c->normalization, layers::Normalization::kLayerNorm);
  EXPECT_FLOAT_EQ(c->layernorm_epsilon, 1e-5f);
  EXPECT_EQ(c->position_embedding_type, layers::PositionEmbedding::kLearnedAbsolute);
  EXPECT_FALSE(c->swiglu);
  EXPECT_FALSE(c->untie_embeddings_and_output_weights);  // GPT-2 ties lm_head to wte
  EXPECT_TRUE(c->add_bias_linear);
  EXPECT_EQ(c->hidden_act, "gelu_new");
  EXPECT_EQ(c->dtype, "float32");
  EXPECT_EQ(GptFlagsString(*c),
            "--num-layers=2 --hidden-size=32 --num-attention-heads=4 --ffn-hidden-size=128 "
            "--max-position-embeddings=32 "
            "--normalization=LayerNorm --norm-epsilon=1e-05 "
            "--position-embedding-type=learned_absolute");
}

constexpr char kLlamaFlags[] =
    "--num-layers=2 --hidden-size=32 --num-attention-heads=4 --ffn-hidden-size=64 "
    "--max-position-embeddings=32 "
    "--normalization=RMSNorm --norm-epsilon=1e-05 --position-embedding-type=rope "
    "--rotary-base=10000 --rotary-percent=1 --swiglu --group-query-attention "
    "--num-query-groups=2 --untie-embeddings-and-output-weights --disable-bias-linear";

TEST(HfConfig, LlamaTinyAndShardedCopy) {
  for (const char* name : {"llama_tiny", "llama_tiny_sharded"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<HfModelConfig> c = ReadHfConfig(TestData(std::string(name) + "/config.json"));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->architecture, "LlamaForCausalLM");
    EXPECT_EQ(c->num_layers, 2);
    EXPECT_EQ(c->hidden_size, 32);
    EXPECT_EQ(c->num_attention_heads, 4);
    EXPECT_TRUE(c->group_query_attention);
    EXPECT_EQ(c->num_query_groups, 2);
    EXPECT_EQ(c->head_dim(), 8);
    EXPECT_EQ(c->ffn_hidden_size, 64);
    EXPECT_EQ(c->vocab_size, 96);
    EXPECT_EQ(c->max_position_embeddings, 32);
    EXPECT_EQ(c->normalization, layers::Normalization::kRMSNorm);
    EXPECT_FLOAT_EQ(c->layernorm_epsilon, 1e-5f);
    EXPECT_EQ(c->position_embedding_type, layers::PositionEmbedding::kRope);
    EXPECT_DOUBLE_EQ(c->rotary_base, 10000);
    EXPECT_DOUBLE_EQ(c->rotary_percent, 1.0);
    EXPECT_TRUE(c->swiglu);
    EXPECT_TRUE(c->untie_embeddings_and_output_weights);
    EXPECT_FALSE(c->add_bias_linear);
    EXPECT_EQ(GptFlagsString(*c), kLlamaFlags);
    EXPECT_EQ(GptFlags(*c).size(), 15u);
  }
}

// Mistral without a sliding window is the same architecture: the same flags.
TEST(HfConfig, MistralWithoutSlidingWindowIsLlama) {
  absl::StatusOr<HfModelConfig> c = ReadHfConfig(TestData("configs/mistral_tiny.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(GptFlagsString(*c), kLlamaFlags);
  // A window covering the whole context is full attention too.
  nlohmann::ordered_json j = ReadJson(TestData("configs/mistral_tiny.json"));
  j["sliding_window"] = 32;
  c = ParseHfConfig(j.dump(), "m.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(GptFlagsString(*c), kLlamaFlags);
}

// Qwen2: Llama's architecture with a bias on q/k/v_proj only (as
// transformers builds it: the config says nothing of biases), tied.
TEST(HfConfig, Qwen2IsLlamaWithAQkvBias) {
  absl::StatusOr<HfModelConfig> c = ReadHfConfig(TestData("qwen2_tiny"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_TRUE(c->add_qkv_bias);
  EXPECT_FALSE(c->add_bias_linear);
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_FALSE(c->untie_embeddings_and_output_weights);
  EXPECT_EQ(GptFlagsString(*c),
            "--num-layers=2 --hidden-size=32 --num-attention-heads=4 --ffn-hidden-size=64 "
            "--max-position-embeddings=32 "
            "--normalization=RMSNorm --norm-epsilon=1e-06 --position-embedding-type=rope "
            "--rotary-base=1000000 --rotary-percent=1 --swiglu --group-query-attention "
            "--num-query-groups=2 --disable-bias-linear --add-qkv-bias");
  // Sliding-window attention is refused, naming the field.
  nlohmann::ordered_json j = ReadJson(TestData("qwen2_tiny/config.json"));
  j["use_sliding_window"] = true;
  c = ParseHfConfig(j.dump(), "q.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("q.json: use_sliding_window = true"));
  j = ReadJson(TestData("qwen2_tiny/config.json"));
  j["layer_types"] = {"full_attention", "sliding_attention"};
  c = ParseHfConfig(j.dump(), "q.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("layer_types"));
}

// Mixtral: Llama's flags (RoPE base 1e6) and the MoE ones.
TEST(HfConfig, MixtralTiny) {
  absl::StatusOr<HfModelConfig> c = ReadHfConfig(TestData("mixtral_tiny"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "MixtralForCausalLM");
  EXPECT_EQ(c->model_type, "mixtral");
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_EQ(c->moe_router_topk, 2);
  EXPECT_DOUBLE_EQ(c->moe_aux_loss_coeff, 0.001);
  EXPECT_EQ(GptFlagsString(*c),
            "--num-layers=2 --hidden-size=32 --num-attention-heads=4 --ffn-hidden-size=64 "
            "--max-position-embeddings=32 "
            "--normalization=RMSNorm --norm-epsilon=1e-05 --position-embedding-type=rope "
            "--rotary-base=1000000 --rotary-percent=1 --swiglu --group-query-attention "
            "--num-query-groups=2 --untie-embeddings-and-output-weights --disable-bias-linear "
            "--num-experts=4 --moe-router-topk=2 --moe-layer-freq=1 --moe-aux-loss-coeff=0.001");
  // No load-balancing loss: no flag for it.
  nlohmann::ordered_json j = ReadJson(TestData("mixtral_tiny/config.json"));
  j["router_aux_loss_coef"] = 0.0;
  c = ParseHfConfig(j.dump(), "m.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(GptFlagsString(*c), Not(HasSubstr("--moe-aux-loss-coeff")));
}

TEST(HfConfig, TiedMultiHeadLlama) {
  absl::StatusOr<HfModelConfig> c = ReadHfConfig(TestData("configs/llama_tied_mha.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->group_query_attention);
  EXPECT_EQ(c->num_query_groups, 4);
  EXPECT_FALSE(c->untie_embeddings_and_output_weights);
  const std::string flags = GptFlagsString(*c);
  EXPECT_THAT(flags, Not(HasSubstr("--group-query-attention")));
  EXPECT_THAT(flags, Not(HasSubstr("--num-query-groups")));
  EXPECT_THAT(flags, Not(HasSubstr("--untie")));
  EXPECT_THAT(flags, HasSubstr("--swiglu"));
}

// transformers 4 spelling: rope_theta / rope_scaling at the top, torch_dtype,
// no head_dim; partial rotary.
TEST(HfConfig, Transformers4Spelling) {
  const char* text = R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 172, "num_attention_heads": 8,
    "num_hidden_layers": 3, "num_key_value_heads": 8, "vocab_size": 1000,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-06, "rope_theta": 500000.0,
    "rope_scaling": null, "hidden_act": "silu", "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "attention_bias": false, "pretraining_tp": 1})";
  absl::StatusOr<HfModelConfig> c = ParseHfConfig(text, "v4/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rotary_base, 500000);
  EXPECT_EQ(c->dtype, "bfloat16");
  EXPECT_FLOAT_EQ(c->layernorm_epsilon, 1e-6f);
  EXPECT_EQ(GptFlagsString(*c),
            "--num-layers=3 --hidden-size=64 --num-attention-heads=8 --ffn-hidden-size=172 "
            "--max-position-embeddings=128 "
            "--normalization=RMSNorm --norm-epsilon=1e-06 --position-embedding-type=rope "
            "--rotary-base=500000 --rotary-percent=1 --swiglu --disable-bias-linear");
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  j["partial_rotary_factor"] = 0.5;
  c = ParseHfConfig(j.dump(), "v4/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rotary_percent, 0.5);
  EXPECT_THAT(GptFlagsString(*c), HasSubstr("--rotary-base=500000 --rotary-percent=0.5 --swiglu"));
  // Every digit of the config's numbers reaches the flags.
  j["rope_theta"] = 1234567.5;
  j["rms_norm_eps"] = 1.2345678e-6;
  c = ParseHfConfig(j.dump(), "v4/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(GptFlagsString(*c), HasSubstr("--norm-epsilon=1.2345678e-06"));
  EXPECT_THAT(GptFlagsString(*c), HasSubstr("--rotary-base=1234567.5"));
}

// What //checkpoint:export writes (export.cc's config.json) reads back as
// the GPT-2 it exported.
TEST(HfConfig, LoomsOwnGpt2Export) {
  const char* text = R"({
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 256,
    "n_positions": 64, "n_ctx": 64, "n_embd": 32, "n_layer": 4, "n_head": 4, "n_inner": 128,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "initializer_range": 0.02,
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": true,
    "torch_dtype": "float32"})";
  absl::StatusOr<HfModelConfig> c = ParseHfConfig(text, "export/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dtype, "float32");
  EXPECT_EQ(c->vocab_size, 256);
  EXPECT_EQ(GptFlagsString(*c),
            "--num-layers=4 --hidden-size=32 --num-attention-heads=4 --ffn-hidden-size=128 "
            "--max-position-embeddings=64 --normalization=LayerNorm --norm-epsilon=1e-05 "
            "--position-embedding-type=learned_absolute");
}

void ExpectRefused(const absl::StatusOr<HfModelConfig>& c, const std::string& path,
                   const std::vector<std::string>& words) {
  ASSERT_FALSE(c.ok()) << "accepted; flags: " << GptFlagsString(*c);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  const std::string msg(c.status().message());
  EXPECT_THAT(msg, HasSubstr(path));
  for (const std::string& w : words) EXPECT_THAT(msg, HasSubstr(w));
}

TEST(HfConfigRefuses, FilesTransformersSaved) {
  const std::string scaled = TestData("configs/llama_rope_scaling.json");
  ExpectRefused(ReadHfConfig(scaled), scaled, {"rope_parameters.rope_type = \"linear\"", "RoPE"});
  const std::string sliding = TestData("configs/mistral_sliding_window.json");
  ExpectRefused(ReadHfConfig(sliding), sliding,
                {"sliding_window = 16", "max_position_embeddings = 32"});
}

struct Mutation {
  const char* model;   // a testdata config
  const char* field;   // JSON pointer-ish: "a" or "a/b"
  const char* value;   // JSON; "DELETE" removes the field
  std::vector<std::string> words;  // in the message besides the path
};

TEST(HfConfigRefuses, UnsupportedFields) {
  const std::vector<Mutation> cases = {
      {"llama_tiny", "rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})",
       {"rope_scaling = {", "llama3", "RoPE scaling is not supported"}},
      {"llama_tiny", "rope_parameters/rope_type", R"("yarn")", {"rope_parameters.rope_type = \"yarn\""}},
      {"llama_tiny", "rope_parameters/factor", "2.0", {"rope_parameters.factor = 2.0"}},
      {"llama_tiny", "attention_bias", "true", {"attention_bias = true"}},
      {"llama_tiny", "mlp_bias", "true", {"mlp_bias = true"}},
      {"llama_tiny", "hidden_act", R"("gelu")", {"hidden_act = \"gelu\"", "silu"}},
      {"llama_tiny", "head_dim", "16", {"head_dim = 16", "= 8"}},
      {"llama_tiny", "num_key_value_heads", "3", {"num_key_value_heads = 3", "does not divide"}},
      {"llama_tiny", "architectures", R"(["LlamaForSequenceClassification"])",
       {"architectures = [\"LlamaForSequenceClassification\"]", "unknown architecture"}},
      {"llama_tiny", "architectures", R"(["BertForMaskedLM"])", {"BertForMaskedLM"}},
      {"llama_tiny", "architectures", "DELETE", {"architectures = (absent)"}},
      {"llama_tiny", "architectures", R"(["LlamaForCausalLM", "GPT2LMHeadModel"])", {"architectures"}},
      {"llama_tiny", "model_type", R"("qwen2")", {"model_type = \"qwen2\"", "LlamaForCausalLM"}},
      {"llama_tiny", "quantization_config", R"({"quant_method": "gptq"})",
       {"quantization_config = {", "quantized"}},
      {"llama_tiny", "hidden_size", "DELETE", {"hidden_size = (absent)", "required"}},
      {"llama_tiny", "vocab_size", R"("96")", {"vocab_size = \"96\"", "positive integer"}},
      {"llama_tiny", "num_hidden_layers", "0", {"num_hidden_layers = 0"}},
      {"llama_tiny", "rms_norm_eps", "-1.0", {"rms_norm_eps = -1.0"}},
      {"configs/mistral_tiny", "sliding_window", "4", {"sliding_window = 4"}},
      {"mixtral_tiny", "router_jitter_noise", "0.01", {"router_jitter_noise = 0.01", "jitter"}},
      {"mixtral_tiny", "num_experts_per_tok", "5",
       {"num_experts_per_tok = 5", "num_local_experts = 4"}},
      {"mixtral_tiny", "num_local_experts", "0", {"num_local_experts = 0", "positive integer"}},
      {"mixtral_tiny", "router_aux_loss_coef", "-0.5", {"router_aux_loss_coef = -0.5"}},
      {"mixtral_tiny", "sliding_window", "16", {"sliding_window = 16"}},
      {"mixtral_tiny", "hidden_act", R"("gelu")", {"hidden_act = \"gelu\"", "silu"}},
      {"mixtral_tiny", "model_type", R"("mistral")", {"model_type = \"mistral\"", "Mixtral"}},
      {"gpt2_tiny", "activation_function", R"("gelu")", {"activation_function = \"gelu\"", "tanh"}},
      {"gpt2_tiny", "activation_function", R"("relu")", {"activation_function = \"relu\""}},
      {"gpt2_tiny", "scale_attn_by_inverse_layer_idx", "true",
       {"scale_attn_by_inverse_layer_idx = true"}},
      {"gpt2_tiny", "scale_attn_weights", "false", {"scale_attn_weights = false"}},
      {"gpt2_tiny", "add_cross_attention", "true", {"add_cross_attention = true"}},
      {"gpt2_tiny", "n_head", "5", {"n_head = 5", "does not divide"}},
      {"gpt2_tiny", "model_type", R"("llama")", {"model_type = \"llama\""}},
  };
  const std::string dir = TempDir("configs");
  int i = 0;
  for (const Mutation& m : cases) {
    SCOPED_TRACE(std::string(m.model) + ": " + m.field + " = " + m.value);
    const std::string src = std::string(m.model).rfind("configs/", 0) == 0
                                ? TestData(std::string(m.model) + ".json")
                                : TestData(std::string(m.model) + "/config.json");
    nlohmann::ordered_json j = ReadJson(src);
    nlohmann::ordered_json* target = &j;
    std::string field = m.field;
    const size_t slash = field.find('/');
    if (slash != std::string::npos) {
      target = &j[field.substr(0, slash)];
      field = field.substr(slash + 1);
    }
    if (std::string(m.value) == "DELETE") {
      target->erase(field);
    } else {
      (*target)[field] = nlohmann::ordered_json::parse(m.value);
    }
    const std::string path = dir + "/case" + std::to_string(i++) + ".json";
    ASSERT_TRUE(WriteFileDurably(path, j.dump(2)).ok());
    ExpectRefused(ReadHfConfig(path), path, m.words);
  }
}

TEST(HfConfigRefuses, BadFiles) {
  const std::string dir = TempDir("bad_configs");
  absl::StatusOr<HfModelConfig> missing = ReadHfConfig(dir);  // folder without config.json
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir + "/config.json"));
  ExpectRefused(ParseHfConfig("{\"architectures\": [", "x/config.json"), "x/config.json",
                {"bad config JSON"});
  ExpectRefused(ParseHfConfig("[]", "x/config.json"), "x/config.json", {"not an object"});
  ExpectRefused(ParseHfConfig(R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_layer": 3})",
                              "x/config.json"),
                "x/config.json", {"'n_layer' appears twice"});
}

}  // namespace
}  // namespace loom::checkpoint::hf
