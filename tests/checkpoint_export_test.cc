// The safetensors export reads back: the JSON header lists every GPT-2 tensor
// with the right shape and contiguous offsets, and every tensor's bytes are
// our tensor under the documented mapping (Conv1D transposes, q|k|v columns).
#include <algorithm>
#include <cstring>

#include "checkpoint/export.h"
#include "checkpoint/file_util.h"
#include "checkpoint/reader.h"
#include "train/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::checkpoint {
namespace testing = ::loom::train::testing;
namespace {

TEST(ExportTest, SafetensorsHeaderAndBytes) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/ckpt";
  const std::string out = std::string(getenv("TEST_TMPDIR")) + "/hf";
  const testing::Layout l{2, 1, 1};
  train::TrainConfig c = testing::TinyConfig(l, 3);
  c.save = dir;
  ASSERT_TRUE(testing::Run(c, l).status.ok());
  ASSERT_TRUE(ExportSafetensors(dir + "/iter_0000003", out).ok());

  auto reader = CheckpointReader::Open(dir + "/iter_0000003");
  ASSERT_TRUE(reader.ok());
  const std::string file = *ReadFile(out + "/model.safetensors");
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  ASSERT_EQ((8 + n) % 8, 0u);
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, n));
  const char* data = file.data() + 8 + n;
  const int64_t h = 32, f = 128, heads = 4, d = 8, vocab = (*reader)->manifest().model().vocab_size();
  // 2 embeddings + 12 per layer + ln_f (2) + metadata.
  EXPECT_EQ(header.size(), 2u + 12u * 4 + 2 + 1);
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  // The tensors tile the data section exactly (sorted by offset).
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    EXPECT_EQ(it.value()["dtype"], "F32") << it.key();
    int64_t numel = 1;
    for (int64_t dim : it.value()["shape"]) numel *= dim;
    const uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    EXPECT_EQ(e - b, numel * 4u) << it.key();
    ranges.push_back({b, e});
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t expect_offset = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, expect_offset);
    expect_offset = e;
  }
  EXPECT_EQ(8 + n + expect_offset, file.size());
  auto tensor = [&](const std::string& name) {
    const auto& e = header.at("transformer." + name);
    return reinterpret_cast<const float*>(data + e["data_offsets"][0].get<uint64_t>());
  };
  auto ours = [&](const std::string& name) { return *(*reader)->ReadGlobal(name, PARAM); };
  EXPECT_EQ(header["transformer.wte.weight"]["shape"], nlohmann::json({vocab, h}));
  EXPECT_EQ(header["transformer.h.1.attn.c_attn.weight"]["shape"], nlohmann::json({h, 3 * h}));
  EXPECT_EQ(header["transformer.h.1.mlp.c_fc.weight"]["shape"], nlohmann::json({h, f}));
  EXPECT_EQ(header["transformer.h.1.mlp.c_proj.weight"]["shape"], nlohmann::json({f, h}));

  // Plain copies.
  EXPECT_EQ(std::memcmp(tensor("wte.weight"), ours("embedding.word_embeddings.weight").data(),
                        vocab * h * 4), 0);
  EXPECT_EQ(std::memcmp(tensor("ln_f.weight"), ours("final_layernorm.weight").data(), h * 4), 0);
  for (int layer = 0; layer < 4; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const std::string q = "h." + std::to_string(layer) + ".";
    // c_attn: HF column j = part * h + head * d + dd, an input row k.
    const auto qkv = ours(p + "attention.qkv.weight");
    const auto qkv_b = ours(p + "attention.qkv.bias");
    const float* c_attn = tensor(q + "attn.c_attn.weight");
    const float* c_attn_b = tensor(q + "attn.c_attn.bias");
    for (int part = 0; part < 3; ++part) {
      for (int head = 0; head < heads; ++head) {
        for (int dd = 0; dd < d; ++dd) {
          const int64_t j = part * h + head * d + dd, row = head * 3 * d + part * d + dd;
          ASSERT_EQ(c_attn_b[j], qkv_b[row]);
          for (int k = 0; k < h; ++k) ASSERT_EQ(c_attn[k * 3 * h + j], qkv[row * h + k]);
        }
      }
    }
    // Conv1D weights are [in, out]: ours transposed.
    const auto dense = ours(p + "attention.dense.weight");  // [h, h]
    const auto fc = ours(p + "mlp.dense_h_to_4h.weight");   // [f, h]
    const auto proj = ours(p + "mlp.dense_4h_to_h.weight"); // [h, f]
    for (int o = 0; o < h; ++o) {
      for (int i = 0; i < h; ++i) ASSERT_EQ(tensor(q + "attn.c_proj.weight")[i * h + o], dense[o * h + i]);
      for (int i = 0; i < f; ++i) {
        ASSERT_EQ(tensor(q + "mlp.c_fc.weight")[o * f + i], fc[i * h + o]);
        ASSERT_EQ(tensor(q + "mlp.c_proj.weight")[i * h + o], proj[o * f + i]);
      }
    }
    EXPECT_EQ(std::memcmp(tensor(q + "ln_2.bias"), ours(p + "post_attention_layernorm.bias").data(),
                          h * 4), 0);
  }
  const nlohmann::json config = nlohmann::json::parse(*ReadFile(out + "/config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_embd"], h);
  EXPECT_EQ(config["n_layer"], 4);
  EXPECT_EQ(config["n_head"], heads);
  EXPECT_EQ(config["vocab_size"], vocab);
  EXPECT_EQ(config["n_positions"], 16);
}

}  // namespace
}  // namespace loom::checkpoint
