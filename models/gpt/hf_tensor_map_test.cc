// The Hugging Face tensor map of each family against small models (dense,
// GQA, MoE, tied and untied): it names every Loom parameter exactly once with
// HF shapes that fit its transform, both directions of every transform are
// each other's inverse bit for bit on random data, and known elements land
// where the documented layouts (tensor_map.h, models/gpt/gpt_config.h) say,
// computed here from the formulas, not through layers::QkvWeightRow.
#include "models/gpt/hf_tensor_map.h"

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "layers/params.h"
#include "models/gpt/gpt_config.h"

namespace loom::checkpoint::hf {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return n;
}

layers::GptConfig Gpt2() {
  layers::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.vocab_size = 50;
  c.seq_length = 8;
  c.max_position_embeddings = 12;
  return c;
}

// GQA (8 heads in 2 groups), untied, SwiGLU with F = 24.
layers::GptConfig Llama(bool untied = true) {
  layers::GptConfig c = Gpt2();
  c.num_attention_heads = 8;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 24;
  c.normalization = layers::Normalization::kRMSNorm;
  c.position_embedding_type = layers::PositionEmbedding::kRope;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = untied;
  return c;
}

layers::GptConfig Mixtral() {
  layers::GptConfig c = Llama();
  c.num_experts = 3;
  c.moe_router_topk = 2;
  c.moe_layer_freq = 1;
  return c;
}

struct Case {
  const char* name;
  HfFamily family;
  layers::GptConfig config;
};

std::vector<Case> Cases() {
  return {{"gpt2", HfFamily::kGpt2, Gpt2()},
          {"llama_gqa_untied", HfFamily::kLlama, Llama()},
          {"llama_mha_tied",
           HfFamily::kLlama,
           [] {
             layers::GptConfig c = Llama(/*untied=*/false);
             c.group_query_attention = false;
             return c;
           }()},
          {"mixtral", HfFamily::kMixtral, Mixtral()}};
}

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const HfMapEntry& Entry(const std::vector<HfMapEntry>& table, const std::string& loom_name) {
  for (const HfMapEntry& e : table) {
    if (e.loom_name == loom_name) return e;
  }
  ADD_FAILURE() << "no entry " << loom_name;
  static const HfMapEntry none{"", {}, {}, Transform::Copy(0)};
  return none;
}

// (a) Every parameter exactly once, its stored shape, HF shapes that fit, and
// no HF name twice.
TEST(TensorMapTest, CoversEveryParameterOnce) {
  for (const Case& k : Cases()) {
    SCOPED_TRACE(k.name);
    const std::vector<HfMapEntry> table = HfTensorMap(k.family, k.config);
    EXPECT_TRUE(CheckCoversModel(table, k.config, k.name).ok());
    std::map<std::string, int> count;
    for (const HfMapEntry& e : table) ++count[e.loom_name];
    const std::vector<layers::ParamSpec> specs = layers::ModelParamSpecs(k.config);
    EXPECT_EQ(table.size(), specs.size());
    for (const layers::ParamSpec& s : specs) {
      EXPECT_EQ(count[s.name], 1) << s.name;
      std::vector<int64_t> stored;
      for (int i = 0; i < s.global_shape.rank(); ++i) stored.push_back(s.global_shape.dim(i));
      if (s.unpadded_rows) stored[0] = s.unpadded_rows;
      EXPECT_EQ(Entry(table, s.name).loom_shape, stored) << s.name;
    }
    std::set<std::string> hf_names;
    for (const HfMapEntry& e : table) {
      ASSERT_EQ(static_cast<int>(e.hf.size()), e.transform.parts()) << e.loom_name;
      int64_t hf_numel = 0;
      for (int p = 0; p < e.transform.parts(); ++p) {
        EXPECT_TRUE(hf_names.insert(e.hf[p].name).second) << e.hf[p].name;
        EXPECT_EQ(Numel(e.hf[p].shape), e.transform.rows(p) * e.transform.width());
        hf_numel += Numel(e.hf[p].shape);
      }
      EXPECT_EQ(hf_numel, Numel(e.loom_shape)) << e.loom_name;
    }
  }
}

// The coverage check catches a table that does not fit the model.
TEST(TensorMapTest, CheckCoversModelNamesWhatIsMissing) {
  const layers::GptConfig moe = Mixtral();
  absl::Status dense = CheckCoversModel(HfTensorMap(HfFamily::kLlama, moe), moe, "Llama");
  EXPECT_FALSE(dense.ok());
  EXPECT_NE(std::string(dense.message()).find("layers.0."), std::string::npos) << dense;
  layers::GptConfig gqa = Gpt2();
  gqa.group_query_attention = true;
  gqa.num_query_groups = 2;
  absl::Status fused = CheckCoversModel(HfTensorMap(HfFamily::kGpt2, gqa), gqa, "GPT-2");
  EXPECT_FALSE(fused.ok());
  EXPECT_NE(std::string(fused.message()).find("attention.qkv"), std::string::npos) << fused;
}

// (b) to_hf(to_loom(x)) == x and to_loom(to_hf(y)) == y, bit for bit.
TEST(TensorMapTest, BothDirectionsAreInverse) {
  std::mt19937 rng(7);
  for (const Case& k : Cases()) {
    SCOPED_TRACE(k.name);
    for (const HfMapEntry& e : HfTensorMap(k.family, k.config)) {
      std::vector<std::vector<float>> hf;
      for (const HfTensorSpec& t : e.hf) hf.push_back(Random(Numel(t.shape), rng));
      auto loom = e.transform.ToLoom(hf);
      ASSERT_TRUE(loom.ok()) << e.loom_name << ": " << loom.status();
      ASSERT_EQ(static_cast<int64_t>(loom->size()), Numel(e.loom_shape)) << e.loom_name;
      auto back = e.transform.ToHf(*loom);
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_EQ(back->size(), hf.size());
      for (size_t p = 0; p < hf.size(); ++p) EXPECT_TRUE(SameBits((*back)[p], hf[p])) << e.hf[p].name;
      const std::vector<float> y = Random(Numel(e.loom_shape), rng);
      auto parts = e.transform.ToHf(y);
      ASSERT_TRUE(parts.ok());
      auto again = e.transform.ToLoom(*parts);
      ASSERT_TRUE(again.ok());
      EXPECT_TRUE(SameBits(*again, y)) << e.loom_name;
    }
  }
}

TEST(TensorMapTest, WrongSizesAreErrors) {
  const Transform t = Transform::QkvProj(Llama(), 16);
  EXPECT_FALSE(t.ToLoom({std::vector<float>(128 * 16)}).ok());  // one part of three
  EXPECT_FALSE(t.ToLoom({std::vector<float>(128 * 16), std::vector<float>(32 * 16),
                         std::vector<float>(31 * 16)})
                   .ok());
  EXPECT_FALSE(t.ToHf(std::vector<float>(5)).ok());
}

// Element `index` of the flat HF tensors `part` set to 1, all else 0: the
// index of the one 1 in the Loom tensor.
int64_t WhereGoes(const HfMapEntry& e, int part, int64_t index) {
  std::vector<std::vector<float>> hf;
  for (const HfTensorSpec& t : e.hf) hf.emplace_back(Numel(t.shape), 0.0f);
  hf[part][index] = 1;
  auto loom = e.transform.ToLoom(std::move(hf));
  EXPECT_TRUE(loom.ok());
  int64_t at = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(loom->size()); ++i) {
    if ((*loom)[i] != 0) {
      EXPECT_EQ(at, -1) << "two places";
      at = i;
    }
  }
  return at;
}

// (c) GPT-2: c_attn [h, 3h] element (k, j), j = part·h + head·d + e, is Loom
// qkv.weight [3h, h] element ((head·3 + part)·d + e, k); the bias likewise;
// Conv1D [in, out] element (i, o) is Loom [out, in] element (o, i).
TEST(TensorMapTest, Gpt2Layout) {
  const layers::GptConfig c = Gpt2();
  const int64_t h = 16, d = 4, f = 64;
  const std::vector<HfMapEntry> table = HfTensorMap(HfFamily::kGpt2, c, "");
  const HfMapEntry& w = Entry(table, "layers.1.attention.qkv.weight");
  EXPECT_EQ(w.hf[0].name, "h.1.attn.c_attn.weight");
  EXPECT_EQ(w.hf[0].shape, (std::vector<int64_t>{h, 3 * h}));
  for (int64_t part : {0, 1, 2}) {
    for (int64_t head : {0, 2, 3}) {
      const int64_t e = 3, k = 5, j = part * h + head * d + e;
      EXPECT_EQ(WhereGoes(w, 0, k * 3 * h + j), ((head * 3 + part) * d + e) * h + k);
      EXPECT_EQ(WhereGoes(Entry(table, "layers.1.attention.qkv.bias"), 0, j),
                (head * 3 + part) * d + e);
    }
  }
  const HfMapEntry& fc = Entry(table, "layers.0.mlp.dense_h_to_4h.weight");
  EXPECT_EQ(fc.hf[0].shape, (std::vector<int64_t>{h, f}));
  EXPECT_EQ(WhereGoes(fc, 0, 7 * f + 50), 50 * h + 7);
  EXPECT_EQ(Entry(table, layers::kWordEmbeddingName).hf[0].name, "wte.weight");
  EXPECT_EQ(Entry(HfTensorMap(HfFamily::kGpt2, c), layers::kFinalNormBiasName).hf[0].name,
            "transformer.ln_f.bias");
}

// (c) Llama with GQA (H = 8, G = 2, n = 4, d = 2): q_proj row j·d + e is Loom
// row ((j/n)·(n+2) + j%n)·d + e; k_proj / v_proj row g·d + e is row
// (g·(n+2) + n)·d + e / (g·(n+2) + n+1)·d + e. The bias triple (Qwen2) with
// width 1 follows the same rows.
TEST(TensorMapTest, LlamaQkvLayout) {
  const layers::GptConfig c = Llama();
  const int64_t h = 16, d = 2, n = 4;
  const std::vector<HfMapEntry> table = HfTensorMap(HfFamily::kLlama, c);
  const HfMapEntry& w = Entry(table, "layers.1.attention.qkv.weight");
  ASSERT_EQ(w.hf.size(), 3u);
  EXPECT_EQ(w.hf[0].name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(w.hf[1].shape, (std::vector<int64_t>{2 * d, h}));
  const Transform bias = Transform::QkvProj(c, 1);
  const HfMapEntry b{"layers.1.attention.qkv.bias", {12 * d}, {{"q", {8 * d}}, {"k", {2 * d}},
                                                              {"v", {2 * d}}}, bias};
  for (int64_t e = 0; e < d; ++e) {
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t row = ((j / n) * (n + 2) + j % n) * d + e;
      EXPECT_EQ(WhereGoes(w, 0, (j * d + e) * h + 9), row * h + 9) << j;
      EXPECT_EQ(WhereGoes(b, 0, j * d + e), row) << j;
    }
    for (int64_t g = 0; g < 2; ++g) {
      EXPECT_EQ(WhereGoes(w, 1, (g * d + e) * h), ((g * (n + 2) + n) * d + e) * h);
      EXPECT_EQ(WhereGoes(w, 2, (g * d + e) * h + 15), ((g * (n + 2) + n + 1) * d + e) * h + 15);
      EXPECT_EQ(WhereGoes(b, 1, g * d + e), (g * (n + 2) + n) * d + e);
      EXPECT_EQ(WhereGoes(b, 2, g * d + e), (g * (n + 2) + n + 1) * d + e);
    }
  }
  EXPECT_EQ(Entry(table, layers::kOutputLayerName).hf[0].name, "lm_head.weight");
}

// (c) SwiGLU: gate_proj [F, h] element (r, k) is dense_h_to_4h [2, F·h]
// element (0, r·h + k), up_proj's is (1, r·h + k); Mixtral's w1 / w3 alike,
// and the router and w2 are copies.
TEST(TensorMapTest, SwigluAndExpertsLayout) {
  const int64_t h = 16, f = 24;
  const std::vector<HfMapEntry> dense = HfTensorMap(HfFamily::kLlama, Llama());
  const HfMapEntry& mlp = Entry(dense, "layers.0.mlp.dense_h_to_4h.weight");
  EXPECT_EQ(mlp.hf[0].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(mlp.hf[1].name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(WhereGoes(mlp, 0, 5 * h + 3), 5 * h + 3);
  EXPECT_EQ(WhereGoes(mlp, 1, 5 * h + 3), f * h + 5 * h + 3);
  const std::vector<HfMapEntry> moe = HfTensorMap(HfFamily::kMixtral, Mixtral());
  const HfMapEntry& expert = Entry(moe, "layers.1.mlp.experts.2.dense_h_to_4h.weight");
  EXPECT_EQ(expert.hf[0].name, "model.layers.1.block_sparse_moe.experts.2.w1.weight");
  EXPECT_EQ(expert.hf[1].name, "model.layers.1.block_sparse_moe.experts.2.w3.weight");
  EXPECT_EQ(WhereGoes(expert, 1, (f - 1) * h + h - 1), 2 * f * h - 1);
  EXPECT_EQ(Entry(moe, "layers.1.mlp.experts.2.dense_4h_to_h.weight").hf[0].name,
            "model.layers.1.block_sparse_moe.experts.2.w2.weight");
  const HfMapEntry& router = Entry(moe, "layers.0.mlp.router.weight");
  EXPECT_EQ(router.hf[0].name, "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(router.hf[0].shape, (std::vector<int64_t>{3, h}));
  EXPECT_EQ(WhereGoes(router, 0, 40), 40);
}

TEST(TensorMapTest, FamilyOfModelType) {
  EXPECT_EQ(*HfFamilyOf("gpt2"), HfFamily::kGpt2);
  EXPECT_EQ(*HfFamilyOf("mistral"), HfFamily::kLlama);
  EXPECT_EQ(*HfFamilyOf("mixtral"), HfFamily::kMixtral);
  EXPECT_FALSE(HfFamilyOf("bert").ok());
}

}  // namespace
}  // namespace loom::checkpoint::hf
