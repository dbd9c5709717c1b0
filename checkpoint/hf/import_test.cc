// //checkpoint:import and //checkpoint:export against the transformers-made
// reference models: import then export gives back the same tensors bit for
// bit (names, shapes, bytes) and the same architecture in config.json; the
// sharded model imports into TP2 x PP2; bf16 export matches torch's
// .to(torch.bfloat16); bad input is refused before anything is written.
#include "checkpoint/hf/import.h"

#include <fstream>

#include "checkpoint/export.h"
#include "checkpoint/file_util.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/hf/test_util.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/reader.h"
#include "gtest/gtest.h"

namespace loom::checkpoint::hf {
namespace {

using testing::TempDir;
using testing::TestData;

#define EXPECT_HAS(status, text) \
  EXPECT_NE(std::string((status).message()).find(text), std::string::npos) << (status)

void ExpectSameTensors(const TensorSet& want, const TensorSet& got) {
  ASSERT_EQ(want.tensors.size(), got.tensors.size());
  for (const NamedTensor& w : want.tensors) {
    const NamedTensor* g = got.Find(w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_EQ(g->dtype, w.dtype) << w.name;
    EXPECT_EQ(g->shape, w.shape) << w.name;
    EXPECT_TRUE(g->data == w.data) << w.name << " differs";
  }
}

void ExpectSameArchitecture(const HfModelConfig& a, const HfModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(GptFlags(a), GptFlags(b));
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
}

class RoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(RoundTrip, ImportThenExportIsBitExact) {
  const std::string name = GetParam();
  const std::string ckpt = TempDir(name + "_ckpt"), out = TempDir(name + "_out");
  ASSERT_TRUE(RemoveTree(ckpt).ok());
  absl::Status s = ImportHuggingFace({TestData(name), ckpt});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(*ReadFile(ckpt + "/latest"), "iter_0000000\n");
  auto reader = CheckpointReader::Open(ckpt + "/iter_0000000");
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Manifest& m = (*reader)->manifest();
  EXPECT_EQ(m.training().iteration(), 0);
  EXPECT_FALSE(m.training().has_optimizer_state());
  auto hf = ReadHfConfig(TestData(name));
  ASSERT_TRUE(hf.ok());
  EXPECT_NE(m.created_by().find(GptFlagsString(*hf)), std::string::npos) << m.created_by();
  const layers::GptConfig c = GptConfigFromProto(m.model());
  EXPECT_EQ(c.seq_length, 32);  // min(max_position_embeddings, 1024)
  EXPECT_TRUE(CheckModelConfig(m.model(), GptConfigFromHf(*hf), ckpt).ok());

  ASSERT_TRUE(ExportSafetensors(ckpt + "/iter_0000000", out).ok());
  auto want = ReadSafetensorsDir(TestData(name));
  auto got = ReadSafetensorsDir(out);
  ASSERT_TRUE(want.ok() && got.ok());
  ExpectSameTensors(*want, *got);
  auto back = ReadHfConfig(out);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameArchitecture(*hf, *back);
}

INSTANTIATE_TEST_SUITE_P(Models, RoundTrip, ::testing::Values("gpt2_tiny", "llama_tiny"));

TEST(ImportTest, ShardedLlamaIntoTp2Pp2) {
  const std::string ckpt = TempDir("sharded_ckpt"), out = TempDir("sharded_out");
  ImportOptions o{TestData("llama_tiny_sharded"), ckpt, 2, 2, 16};
  absl::Status s = ImportHuggingFace(o);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(IsDirectory(ckpt + ".import_1x1"));
  auto reader = CheckpointReader::Open(ckpt + "/iter_0000000");
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->VerifyAll().ok());
  const Manifest& m = (*reader)->manifest();
  EXPECT_EQ(m.layout().tensor_parallel(), 2);
  EXPECT_EQ(m.layout().pipeline_parallel(), 2);
  EXPECT_EQ(m.files_size(), 4);
  EXPECT_EQ(m.model().seq_length(), 16);
  EXPECT_EQ(m.model().normalization(), "RMSNorm");
  EXPECT_TRUE(m.model().disable_bias_linear());
  ASSERT_TRUE(ExportSafetensors(ckpt + "/iter_0000000", out).ok());
  auto want = ReadSafetensorsDir(TestData("llama_tiny_sharded"));
  auto got = ReadSafetensorsDir(out);
  ASSERT_TRUE(want.ok() && got.ok());
  ExpectSameTensors(*want, *got);
}

TEST(ImportTest, Bf16ExportMatchesTorch) {
  const std::string ckpt = TempDir("bf16_ckpt"), out = TempDir("bf16_out");
  ASSERT_TRUE(ImportHuggingFace({TestData("llama_tiny"), ckpt}).ok());
  ASSERT_TRUE(ExportSafetensors(ckpt + "/iter_0000000", out, Dtype::kBF16).ok());
  auto want = ReadSafetensorsDir(TestData("llama_tiny_bf16"));
  auto got = ReadSafetensorsDir(out);
  ASSERT_TRUE(want.ok() && got.ok());
  ExpectSameTensors(*want, *got);
  auto back = ReadHfConfig(out);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, "bfloat16");
}

void CopyFile(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream o(to, std::ios::binary);
  o << in.rdbuf();
}

TEST(ImportTest, BadInputNamesTheFileAndWritesNothing) {
  const std::string ckpt = TempDir("bad_ckpt");
  ASSERT_TRUE(RemoveTree(ckpt).ok());
  absl::Status missing = ImportHuggingFace({"/nonexistent/hf", ckpt});
  EXPECT_HAS(missing, "/nonexistent/hf");

  const std::string no_config = TempDir("no_config");
  absl::Status c = ImportHuggingFace({no_config, ckpt});
  EXPECT_FALSE(c.ok());
  EXPECT_HAS(c, no_config + "/config.json");

  // config.json but no weights.
  const std::string no_weights = TempDir("no_weights");
  CopyFile(TestData("llama_tiny/config.json"), no_weights + "/config.json");
  absl::Status w = ImportHuggingFace({no_weights, ckpt});
  EXPECT_FALSE(w.ok());
  EXPECT_HAS(w, no_weights);

  // A sharded model with a shard gone.
  const std::string lost = TempDir("lost_shard");
  for (const char* f : {"config.json", "model.safetensors.index.json",
                        "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"}) {
    CopyFile(TestData(std::string("llama_tiny_sharded/") + f), lost + "/" + f);
  }
  absl::Status l = ImportHuggingFace({lost, ckpt});
  EXPECT_FALSE(l.ok());
  EXPECT_HAS(l, "model-00002-of-00003.safetensors");

  // An unsupported config: hf_config's error.
  const std::string scaled = TempDir("rope_scaling");
  CopyFile(TestData("configs/llama_rope_scaling.json"), scaled + "/config.json");
  CopyFile(TestData("llama_tiny/model.safetensors"), scaled + "/model.safetensors");
  absl::Status r = ImportHuggingFace({scaled, ckpt});
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r, ReadHfConfig(scaled + "/config.json").status());

  // Llama's 2 query groups over TP 4; GPT-2's 4 heads over TP 3.
  absl::Status g = ImportHuggingFace({TestData("llama_tiny"), ckpt, 4, 1});
  EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(g, "--target-tensor-parallel-size=4");
  EXPECT_HAS(g, "--num-query-groups");
  absl::Status h = ImportHuggingFace({TestData("gpt2_tiny"), ckpt, 3, 1});
  EXPECT_EQ(h.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(h, "--target-tensor-parallel-size=3");
  EXPECT_HAS(h, "--num-attention-heads");
  EXPECT_FALSE(IsDirectory(ckpt));
}

// Tensors the config does not account for, missing or misshapen ones.
TEST(ImportTest, TensorsMustMatchTheConfig) {
  const std::string ckpt = TempDir("tensors_ckpt");
  ASSERT_TRUE(RemoveTree(ckpt).ok());
  auto original = ReadSafetensorsDir(TestData("llama_tiny"));
  ASSERT_TRUE(original.ok());
  auto variant = [&](const std::string& dir_name, auto edit) {
    const std::string dir = TempDir(dir_name);
    CopyFile(TestData("llama_tiny/config.json"), dir + "/config.json");
    std::vector<NamedTensor> tensors = original->tensors;
    edit(&tensors);
    EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
    return ImportHuggingFace({dir, ckpt});
  };
  absl::Status extra = variant("extra", [](std::vector<NamedTensor>* t) {
    t->push_back(
        NamedTensor::FromF32("model.layers.0.self_attn.q_proj.bias", {32}, std::vector<float>(32)));
  });
  EXPECT_HAS(extra, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_HAS(extra, "has no place");
  absl::Status missing =
      variant("missing", [](std::vector<NamedTensor>* t) { t->erase(t->begin() + 3); });
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(missing, (*original).tensors[3].name);
  absl::Status shape = variant("shape", [](std::vector<NamedTensor>* t) {
    for (NamedTensor& x : *t) {
      if (x.name == "model.norm.weight")
        x = NamedTensor::FromF32(x.name, {16}, std::vector<float>(16));
    }
  });
  EXPECT_HAS(shape, "model.norm.weight");
  EXPECT_HAS(shape, "[16]");
  EXPECT_FALSE(IsDirectory(ckpt));
}

}  // namespace
}  // namespace loom::checkpoint::hf
