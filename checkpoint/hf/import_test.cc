// //checkpoint:import and //checkpoint:export against the transformers-made
// reference models: import then export gives back the same tensors bit for
// bit (names, shapes, bytes) and the same architecture in config.json; the
// sharded model imports into TP2 x PP2; bf16 export matches torch's
// .to(torch.bfloat16); bad input is refused before anything is written.
#include "checkpoint/hf/import.h"

#include <algorithm>
#include <fstream>
#include <functional>

#include "checkpoint/export.h"
#include "checkpoint/file_util.h"
#include "checkpoint/format.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/safetensors.h"
#include "checkpoint/hf/test_util.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/reader.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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
  absl::StatusOr<layers::GptConfig> c = GptConfigFromProto(m.model(), ckpt);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->seq_length, 32);  // min(max_position_embeddings, 1024)
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

INSTANTIATE_TEST_SUITE_P(Models, RoundTrip,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "mixtral_tiny",
                                           "qwen2_tiny"));

// The manifest records the experts; they reshard over TP 2 x PP 2 (each
// expert split like the dense MLP) and export back bit for bit.
TEST(ImportTest, MixtralIntoTp2Pp2) {
  const std::string ckpt = TempDir("mixtral_ckpt"), out = TempDir("mixtral_out");
  ASSERT_TRUE(ImportHuggingFace({TestData("mixtral_tiny"), ckpt, 2, 2, 16}).ok());
  auto reader = CheckpointReader::Open(ckpt + "/iter_0000000");
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->VerifyAll().ok());
  const ModelConfig& m = (*reader)->manifest().model();
  EXPECT_EQ(m.num_experts(), 4);
  EXPECT_EQ(m.moe_router_topk(), 2);
  EXPECT_EQ(m.moe_layer_freq(), 1);
  EXPECT_TRUE(m.swiglu());
  EXPECT_TRUE(m.disable_bias_linear());
  EXPECT_FLOAT_EQ(m.rotary_base(), 1e6f);
  ASSERT_TRUE(m.has_moe_aux_loss_coeff());
  EXPECT_FLOAT_EQ(m.moe_aux_loss_coeff(), 0.001f);  // the config's router_aux_loss_coef
  // Expert 3 of layer 1: w1 (gate) then w3 (up) in dense_h_to_4h.
  auto loom = (*reader)->ReadGlobal("layers.1.mlp.experts.3.dense_h_to_4h.weight", PARAM);
  ASSERT_TRUE(loom.ok()) << loom.status();
  auto hf = ReadSafetensorsDir(TestData("mixtral_tiny"));
  ASSERT_TRUE(hf.ok());
  const NamedTensor* w1 = hf->Find("model.layers.1.block_sparse_moe.experts.3.w1.weight");
  const NamedTensor* w3 = hf->Find("model.layers.1.block_sparse_moe.experts.3.w3.weight");
  ASSERT_TRUE(w1 != nullptr && w3 != nullptr);
  std::vector<float> gate_up = *w1->ToF32();
  const std::vector<float> up = *w3->ToF32();
  gate_up.insert(gate_up.end(), up.begin(), up.end());
  EXPECT_EQ(*loom, gate_up);
  ASSERT_TRUE(ExportSafetensors(ckpt + "/iter_0000000", out).ok());
  auto got = ReadSafetensorsDir(out);
  ASSERT_TRUE(got.ok());
  ExpectSameTensors(*hf, *got);
  const auto config = nlohmann::json::parse(*ReadFile(out + "/config.json"));
  EXPECT_EQ(config["architectures"], nlohmann::json({"MixtralForCausalLM"}));
  EXPECT_EQ(config["num_local_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["output_router_logits"], false);
  EXPECT_EQ(config["router_aux_loss_coef"], 0.001);  // mixtral_tiny's, through the checkpoint
  EXPECT_TRUE(config["sliding_window"].is_null());
  EXPECT_FALSE(config.contains("mlp_bias"));
}

// The export writes the coefficient the checkpoint recorded (the run's
// --moe-aux-loss-coeff), and Mixtral's default for a checkpoint without one.
TEST(ImportTest, ExportWritesTheRecordedAuxLossCoefficient) {
  const std::string ckpt = TempDir("aux_coef_ckpt"), out = TempDir("aux_coef_out");
  ASSERT_TRUE(ImportHuggingFace({TestData("mixtral_tiny"), ckpt}).ok());
  const std::string file = ckpt + "/iter_0000000/manifest.pb";
  auto manifest = DecodeManifest(*ReadFile(file), file);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto exported = [&](auto edit) {
    Manifest m = *manifest;
    edit(m.mutable_model());
    EXPECT_TRUE(WriteFileAtomically(file, EncodeManifest(m)).ok());
    EXPECT_TRUE(ExportSafetensors(ckpt + "/iter_0000000", out).ok());
    return nlohmann::json::parse(*ReadFile(out + "/config.json"))["router_aux_loss_coef"];
  };
  EXPECT_EQ(exported([](ModelConfig* m) { m->set_moe_aux_loss_coeff(0.02f); }), 0.02);
  EXPECT_EQ(exported([](ModelConfig* m) { m->set_moe_aux_loss_coeff(0.0f); }), 0.0);
  EXPECT_EQ(exported([](ModelConfig* m) { m->clear_moe_aux_loss_coeff(); }), 0.001);
}

// MoE checkpoints Mixtral cannot express: dense layers between MoE layers,
// GELU experts. The manifest is edited (export checks it before any tensor).
TEST(ImportTest, ExportRefusesMoeThatIsNotMixtral) {
  const std::string ckpt = TempDir("moe_freq_ckpt"), out = TempDir("moe_freq_out");
  ASSERT_TRUE(ImportHuggingFace({TestData("mixtral_tiny"), ckpt}).ok());
  const std::string file = ckpt + "/iter_0000000/manifest.pb";
  auto bytes = ReadFile(file);
  ASSERT_TRUE(bytes.ok());
  auto manifest = DecodeManifest(*bytes, file);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto refused = [&](auto edit) {
    Manifest m = *manifest;
    edit(m.mutable_model());
    EXPECT_TRUE(WriteFileAtomically(file, EncodeManifest(m)).ok());
    return ExportSafetensors(ckpt + "/iter_0000000", out);
  };
  absl::Status freq = refused([](ModelConfig* m) { m->set_moe_layer_freq(2); });
  EXPECT_EQ(freq.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(freq, "--moe-layer-freq=2");
  EXPECT_HAS(freq, "MixtralForCausalLM");
  EXPECT_HAS(freq, ckpt);
  absl::Status gelu = refused([](ModelConfig* m) { m->set_swiglu(false); });
  EXPECT_EQ(gelu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(gelu, "--num-experts=4");
  EXPECT_HAS(gelu, "--swiglu");
  EXPECT_FALSE(PathExists(out + "/model.safetensors"));
}

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

// Imports into `ckpt` the folder `dir_name`: `model`'s config.json with its
// tensors changed by `edit`.
absl::Status ImportEdited(const std::string& model, const std::string& dir_name,
                          const std::string& ckpt,
                          const std::function<void(std::vector<NamedTensor>*)>& edit) {
  auto original = ReadSafetensorsDir(TestData(model));
  EXPECT_TRUE(original.ok()) << original.status();
  const std::string dir = TempDir(dir_name);
  CopyFile(TestData(model + "/config.json"), dir + "/config.json");
  std::vector<NamedTensor> tensors = original->tensors;
  edit(&tensors);
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  return ImportHuggingFace({dir, ckpt});
}

// Tensors the config does not account for, missing or misshapen ones.
TEST(ImportTest, TensorsMustMatchTheConfig) {
  const std::string ckpt = TempDir("tensors_ckpt");
  ASSERT_TRUE(RemoveTree(ckpt).ok());
  auto original = ReadSafetensorsDir(TestData("llama_tiny"));
  ASSERT_TRUE(original.ok());
  auto variant = [&](const std::string& dir_name, auto edit) {
    return ImportEdited("llama_tiny", dir_name, ckpt, edit);
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

// The same for Mixtral's experts: a fifth expert the config does not have,
// a missing one, and an up projection (w3) of the wrong shape.
TEST(ImportTest, MixtralExpertsMustMatchTheConfig) {
  const std::string ckpt = TempDir("mixtral_tensors_ckpt");
  ASSERT_TRUE(RemoveTree(ckpt).ok());
  auto variant = [&](const std::string& dir_name, auto edit) {
    return ImportEdited("mixtral_tiny", dir_name, ckpt, edit);
  };
  const std::string expert = "model.layers.1.block_sparse_moe.experts.";
  absl::Status extra = variant("mixtral_extra", [&](std::vector<NamedTensor>* t) {
    t->push_back(NamedTensor::FromF32(expert + "4.w1.weight", {64, 32}, std::vector<float>(2048)));
  });
  EXPECT_HAS(extra, expert + "4.w1.weight");
  EXPECT_HAS(extra, "has no place");
  absl::Status missing = variant("mixtral_missing", [&](std::vector<NamedTensor>* t) {
    t->erase(std::find_if(t->begin(), t->end(),
                          [&](const NamedTensor& x) { return x.name == expert + "2.w2.weight"; }));
  });
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(missing, expert + "2.w2.weight");
  absl::Status shape = variant("mixtral_shape", [&](std::vector<NamedTensor>* t) {
    for (NamedTensor& x : *t) {
      if (x.name == expert + "0.w3.weight") {
        x = NamedTensor::FromF32(x.name, {32, 64}, std::vector<float>(2048));
      }
    }
  });
  EXPECT_HAS(shape, expert + "0.w3.weight");
  EXPECT_HAS(shape, "[64, 32]");
  EXPECT_FALSE(IsDirectory(ckpt));
}

}  // namespace
}  // namespace loom::checkpoint::hf
