// The logits of Hugging Face models imported with checkpoint::hf::
// ImportHuggingFace (checkpoint/hf/testdata: a tiny GPT-2, Llama, Mixtral and Qwen2,
// made by transformers) match transformers' own logits on the committed
// input ids, at TP 1 and 2 x PP 1 and 2 (ranks as threads, stages run one
// after the other), and a wrong weight mapping does not.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/file_util.h"
#include "checkpoint/format.h"
#include "checkpoint/hf/import.h"
#include "checkpoint/rank_state.h"
#include "checkpoint/reader.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "layers/test_util.h"
#include "models/gpt/gpt_model.h"
#include "nlohmann/json.hpp"

namespace loom::train {
namespace {

using core::Tensor;

// f32 end to end. Measured (max |error| / max |logit|): 6.7e-7 to 7.8e-7 for
// GPT-2 and Llama, 7.9e-7 to 9.6e-7 for Mixtral, at TP 1, TP 2 and PP 2; a
// wrong mapping: above 0.8.
constexpr double kTolerance = 1e-5;

// checkpoint/hf/testdata/<name>: in the runfiles, else from the source tree
// (the binary run from the workspace root).
std::string TestData(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string rel = "checkpoint/hf/testdata/" + name;
  if (srcdir != nullptr && workspace != nullptr) {
    const std::string p = std::string(srcdir) + "/" + workspace + "/" + rel;
    if (checkpoint::PathExists(p)) return p;
  }
  return rel;
}

std::string TmpDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string d = std::string(tmp != nullptr ? tmp : "/tmp") + "/hf_logits_" + name;
  (void)checkpoint::RemoveTree(d);
  return d;
}

struct Reference {
  int64_t batch = 0, seq = 0, vocab = 0;
  std::vector<std::vector<int32_t>> ids;  // [b][s]
  std::vector<float> logits;              // [b, s, V]
};

Reference ReadReference(const std::string& model) {
  Reference r;
  std::ifstream jf(TestData(model + "/reference.json"));
  EXPECT_TRUE(jf.good()) << TestData(model + "/reference.json");
  const nlohmann::json j = nlohmann::json::parse(jf);
  r.ids = j["input_ids"].get<std::vector<std::vector<int32_t>>>();
  const auto shape = j["logits_shape"].get<std::vector<int64_t>>();
  r.batch = shape[0];
  r.seq = shape[1];
  r.vocab = shape[2];
  std::ifstream lf(TestData(model + "/" + j["logits_file"].get<std::string>()), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(lf)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size(), static_cast<size_t>(r.batch * r.seq * r.vocab * 4));
  r.logits.resize(bytes.size() / 4);
  std::memcpy(r.logits.data(), bytes.data(), bytes.size());
  return r;
}

absl::StatusOr<layers::GptConfig> ManifestConfig(const std::string& dir) {
  LOOM_ASSIGN_OR_RETURN(std::string path, checkpoint::ResolveCheckpoint(dir, std::nullopt));
  const std::string file = checkpoint::JoinPath(path, "manifest.pb");
  LOOM_ASSIGN_OR_RETURN(std::string bytes, checkpoint::ReadFile(file));
  LOOM_ASSIGN_OR_RETURN(checkpoint::Manifest m, checkpoint::DecodeManifest(bytes, file));
  return checkpoint::GptConfigFromProto(m.model(), file);
}

// max |logits - reference| / max |reference|, logits [s, b, V (padded)].
double MaxError(const Tensor& logits, const Reference& ref) {
  const int64_t v = logits.dim(2);
  EXPECT_GE(v, ref.vocab);
  std::vector<float> got(ref.logits.size());
  for (int64_t b = 0; b < ref.batch; ++b) {
    for (int64_t t = 0; t < ref.seq; ++t) {
      for (int64_t k = 0; k < ref.vocab; ++k) {
        got[(b * ref.seq + t) * ref.vocab + k] = logits.data<float>()[(t * ref.batch + b) * v + k];
      }
    }
  }
  return layers::testing::MaxRelativeError(got, ref.logits);
}

// Something done to every rank's loaded weights before the forward (TP 1,
// PP 1 only): a wrong mapping on purpose.
using Corrupt = std::function<void(layers::GptModel&)>;

// Imports `model` for TP `tp` x PP `pp` (pp is 1 or 2), loads it on tp x pp
// ranks (rank = pp_rank * tp + tp_rank; the loader is collective over all),
// runs the forward on the reference ids, stage by stage, with stage 0's
// hidden state handed to stage 1's rank of the same TP rank (what the
// pipeline's p2p carries), and returns the max relative error of the logits.
double LogitsError(const std::string& model, int tp, int pp, const Corrupt& corrupt = nullptr) {
  const Reference ref = ReadReference(model);
  const std::string layout = "TP " + std::to_string(tp) + " x PP " + std::to_string(pp);
  const std::string dir = TmpDir(model + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp));
  checkpoint::hf::ImportOptions o;
  o.hf_dir = TestData(model);
  o.save_dir = dir;
  o.target_tp = tp;
  o.target_pp = pp;
  o.seq_length = ref.seq;
  absl::Status imported = checkpoint::hf::ImportHuggingFace(o);
  EXPECT_TRUE(imported.ok()) << imported;
  if (!imported.ok()) return INFINITY;
  absl::StatusOr<layers::GptConfig> config = ManifestConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return INFINITY;
  EXPECT_EQ(config->vocab_size, ref.vocab);
  EXPECT_EQ(config->seq_length, ref.seq);
  // The default padding (128 x TP): at TP 2 rank 1 holds only padding rows
  // of the 96-row vocabulary and reads nothing from the checkpoint.
  const int64_t num_layers = config->num_layers;

  double error = INFINITY;
  std::vector<Tensor> handoff(tp);  // stage 0's output, by TP rank
  absl::Status s = layers::testing::RunRanks(tp * pp, [&](int rank, comm::Communicator* world)
                                                          -> absl::Status {
    const int pp_rank = rank / tp, tp_rank = rank % tp;
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> tp_comm,
                          world->Split(pp_rank, tp_rank, "tp"));
    layers::ChunkSpec chunk;
    chunk.first_layer = pp_rank == 0 ? 0 : num_layers / 2;
    chunk.num_layers = pp == 1 ? num_layers : pp_rank == 0 ? num_layers / 2
                                                           : num_layers - num_layers / 2;
    chunk.pre_process = pp_rank == 0;
    chunk.post_process = pp_rank == pp - 1;
    layers::TpGroup group{tp > 1 ? tp_comm.get() : nullptr, false};
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<layers::GptModel> m,
                          layers::GptModel::Create(*config, group, {chunk}));
    checkpoint::RankView view;
    view.model = *config;
    view.params = &m->params();
    view.tp_rank = tp_rank;
    view.pp_rank = pp_rank;
    LOOM_RETURN_IF_ERROR(
        checkpoint::LoadCheckpoint(world, dir, std::nullopt, view, /*load_optimizer=*/false)
            .status());
    if (corrupt) corrupt(*m);
    LOOM_RETURN_IF_ERROR(m->params().SyncComputeCopy());
    LOOM_ASSIGN_OR_RETURN(Tensor ids, Tensor::Zeros(core::Shape{ref.seq, ref.batch},
                                                    core::DType::kI32));
    for (int64_t t = 0; t < ref.seq; ++t) {
      for (int64_t b = 0; b < ref.batch; ++b) ids.data<int32_t>()[t * ref.batch + b] = ref.ids[b][t];
    }
    layers::DropoutStream eval;
    eval.training = false;
    layers::GptModel::Saved saved;
    double loss = 0;
    Tensor input = ids;
    if (pp == 2) {
      if (pp_rank == 0) {
        LOOM_ASSIGN_OR_RETURN(handoff[tp_rank], m->Forward(0, ids, ids, eval, &saved, nullptr));
      }
      LOOM_RETURN_IF_ERROR(world->Barrier()->Wait());  // stage 0's outputs are in handoff
      if (pp_rank == 0) return absl::OkStatus();
      input = handoff[tp_rank];
    }
    LOOM_RETURN_IF_ERROR(m->Forward(0, input, ids, eval, &saved, &loss).status());
    LOOM_ASSIGN_OR_RETURN(Tensor logits, m->GatherLogits(saved));  // [s, b, V (padded)]
    if (tp_rank == 0) error = MaxError(logits, ref);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  std::printf("%s %s%s: max |logits - transformers| / max |transformers| = %.3g\n",
              model.c_str(), layout.c_str(), corrupt ? " (wrong mapping)" : "", error);
  return error;
}

TEST(HfLogitsTest, Gpt2MatchesTransformers) {
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) EXPECT_LT(LogitsError("gpt2_tiny", tp, pp), kTolerance);
  }
}

TEST(HfLogitsTest, LlamaMatchesTransformers) {
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) EXPECT_LT(LogitsError("llama_tiny", tp, pp), kTolerance);
  }
}

// Loom's top-2 of 4 experts (softmax over the chosen logits) is Mixtral's
// (softmax over all, top-2, renormalised).
TEST(HfLogitsTest, MixtralMatchesTransformers) {
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) EXPECT_LT(LogitsError("mixtral_tiny", tp, pp), kTolerance);
  }
}

// Qwen2: Llama's architecture with a bias on q/k/v_proj only (--add-qkv-bias
// with --disable-bias-linear), tied embeddings.
TEST(HfLogitsTest, Qwen2MatchesTransformers) {
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) EXPECT_LT(LogitsError("qwen2_tiny", tp, pp), kTolerance);
  }
}

// A wrong mapping is caught: GPT-2's Conv1D attention output projection
// left untransposed, Llama's gate and up projections swapped, and Mixtral's
// router rows of experts 0 and 1 swapped (each router row must stay with its
// expert), and Qwen2's key bias taken for the value bias (the bias rows must
// follow their weight rows).
TEST(HfLogitsTest, WrongMappingFails) {
  EXPECT_GT(LogitsError("gpt2_tiny", 1, 1,
                        [](layers::GptModel& m) {
                          layers::Param& p = m.params().at("layers.0.attention.dense.weight");
                          const int64_t h = p.value.dim(0);
                          float* w = p.value.data<float>();
                          for (int64_t i = 0; i < h; ++i) {
                            for (int64_t j = i + 1; j < h; ++j) std::swap(w[i * h + j], w[j * h + i]);
                          }
                        }),
            100 * kTolerance);
  EXPECT_GT(LogitsError("llama_tiny", 1, 1,
                        [](layers::GptModel& m) {
                          layers::Param& p = m.params().at("layers.0.mlp.dense_h_to_4h.weight");
                          const int64_t half = p.value.numel() / 2;
                          float* w = p.value.data<float>();
                          for (int64_t i = 0; i < half; ++i) std::swap(w[i], w[half + i]);
                        }),
            100 * kTolerance);
  EXPECT_GT(LogitsError("mixtral_tiny", 1, 1,
                        [](layers::GptModel& m) {
                          layers::Param& p = m.params().at("layers.0.mlp.router.weight");
                          const int64_t h = p.value.dim(1);
                          float* w = p.value.data<float>();
                          std::swap_ranges(w, w + h, w + h);
                        }),
            100 * kTolerance);
  EXPECT_GT(LogitsError("qwen2_tiny", 1, 1,
                        [](layers::GptModel& m) {
                          // [group 0: q0, q1, k, v; group 1: ...], d rows each.
                          layers::Param& p = m.params().at("layers.0.attention.qkv.bias");
                          const int64_t d = p.value.numel() / 8;
                          float* b = p.value.data<float>();
                          std::swap_ranges(b + 2 * d, b + 3 * d, b + 3 * d);
                        }),
            100 * kTolerance);
}

}  // namespace
}  // namespace loom::train
