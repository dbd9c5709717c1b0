// Every tensor-parallel layout (TP 2, 3, 4; with and without sequence
// parallelism) reproduces the single-rank model: loss, logits and every
// parameter gradient (gathered to full size) over several SGD steps, with
// hidden and attention dropout on (each rank draws its slice of the global
// masks). Both architectures: GPT-2 and Llama-style (RMSNorm, RoPE, SwiGLU,
// grouped-query attention, untied output layer, no linear biases), and
// Mixtral-style mixture of experts (dropless, and with a capacity that drops
// and pads). Ranks are threads on the `local` backend.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Tensor;
using testing::GatherFull;
using testing::MaxRelativeError;
using testing::RandomIds;
using testing::StepDropout;
using testing::ToVector;

// f32 sums over differently split GEMMs and all-reduces: relative error per
// tensor (max |diff| / max |reference|).
constexpr double kTolerance = 1e-5;
constexpr int kSteps = 3;
constexpr float kLr = 0.5f;

GptConfig TestConfig() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 48;
  c.num_attention_heads = 12;  // divisible by 1, 2, 3, 4
  c.seq_length = 12;
  c.vocab_size = 100;
  c.make_vocab_size_divisible_by = 8;  // padded vocab differs for every TP
  c.seed = 42;
  return c;
}

// Llama-style. TP splits K/V groups: 4 heads in 2 groups for TP 1 and 2;
// TP 3 and 4 need 3 and 4 groups (6 and 8 heads, two per group; TP 3 also
// rotates only half of each head).
GptConfig LlamaConfig(int tp) {
  GptConfig c = TestConfig();
  c.normalization = layers::Normalization::kRMSNorm;
  c.layernorm_epsilon = 1e-6f;
  c.position_embedding_type = layers::PositionEmbedding::kRope;
  c.swiglu = true;
  c.ffn_hidden_size = 96;  // divisible by 1, 2, 3, 4
  c.group_query_attention = true;
  c.num_attention_heads = tp <= 2 ? 4 : 2 * tp;
  c.num_query_groups = tp <= 2 ? 2 : tp;
  c.rotary_percent = tp == 3 ? 0.5f : 1.0f;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = false;
  return c;
}

// Mixtral-style: the Llama-style model with an MoE MLP in every other layer
// (4 experts, top-2, load-balancing and z losses), dropless or with a
// capacity that drops and pads (every layout must drop the same assignments).
// Qwen2-style: the Llama-style model with a bias on the QKV projection only
// (its rows split with the weight's over TP).
enum class Arch { kGpt2, kLlama, kQwen2, kMoe, kMoeCapacity };
GptConfig ConfigOf(Arch arch, int tp) {
  if (arch == Arch::kGpt2) return TestConfig();
  GptConfig c = LlamaConfig(tp);
  if (arch == Arch::kLlama) return c;
  if (arch == Arch::kQwen2) {
    c.add_qkv_bias = true;
    return c;
  }
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_layer_freq = 2;  // layer 0 MoE, layer 1 dense
  c.moe_aux_loss_coeff = 0.01f;
  c.moe_z_loss_coeff = 0.001f;
  if (arch == Arch::kMoeCapacity) {
    c.moe_expert_capacity_factor = 0.75f;
    c.moe_pad_expert_input_to_capacity = true;
  }
  return c;
}
const char* ArchName(Arch a) {
  switch (a) {
    case Arch::kGpt2: return "";
    case Arch::kLlama: return "_llama";
    case Arch::kQwen2: return "_qwen2";
    case Arch::kMoe: return "_moe";
    case Arch::kMoeCapacity: return "_moe_capacity";
  }
  return "";
}

struct Reference {
  std::vector<double> losses;
  std::vector<std::vector<float>> logits;                       // per step, [s, b, V]
  std::vector<std::map<std::string, std::vector<float>>> grads;  // per step
};

constexpr int64_t kBatch = 2;

Reference RunReference(const GptConfig& config) {
  Reference ref;
  auto model = GptModel::Create(config, TpGroup{});
  EXPECT_TRUE(model.ok()) << model.status();
  for (int step = 0; step < kSteps; ++step) {
    Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100 + step);
    Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 200 + step);
    EXPECT_TRUE((*model)->params().ZeroGrads().ok());
    GptModel::Saved saved;
    double loss = 0;
    EXPECT_TRUE((*model)->Forward(0, ids, targets, StepDropout(step), &saved, &loss).ok());
    EXPECT_TRUE((*model)->Backward(0, Tensor(), 1.0f, StepDropout(step), saved).ok());
    ref.losses.push_back(loss);
    ref.logits.push_back(ToVector(*(*model)->GatherLogits(saved)));
    std::map<std::string, std::vector<float>> g;
    for (Param& p : (*model)->params().params()) {
      g[p.spec->name] = ToVector(p.grad);
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        p.value.data<float>()[i] -= kLr * p.grad.data<float>()[i];
      }
    }
    ref.grads.push_back(g);
  }
  return ref;
}

class EquivalenceTest : public ::testing::TestWithParam<std::tuple<int, bool, Arch>> {};

TEST_P(EquivalenceTest, MatchesSingleRank) {
  const auto [tp_size, sp, arch] = GetParam();
  const GptConfig config = ConfigOf(arch, tp_size);
  const Reference ref = RunReference(config);
  absl::Status s = testing::RunRanks(tp_size, [&](int rank, comm::Communicator* comm) -> absl::Status {
    TpGroup tp{comm, sp};
    auto model = GptModel::Create(config, tp);
    if (!model.ok()) return model.status();
    for (int step = 0; step < kSteps; ++step) {
      Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100 + step);
      Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 200 + step);
      EXPECT_TRUE((*model)->params().ZeroGrads().ok());
      GptModel::Saved saved;
      double loss = 0;
      absl::Status f =
          (*model)->Forward(0, ids, targets, StepDropout(step), &saved, &loss).status();
      if (!f.ok()) return f;
      absl::Status b = (*model)->Backward(0, Tensor(), 1.0f, StepDropout(step), saved).status();
      if (!b.ok()) return b;
      absl::Status r = AllReduceSequenceParallelGrads(
          tp, &(*model)->params(), {{0, (*model)->params().padded_numel()}});
      if (!r.ok()) return r;
      EXPECT_NEAR(loss, ref.losses[step], kTolerance * std::abs(ref.losses[step]))
          << "rank " << rank << " step " << step;
      auto logits = (*model)->GatherLogits(saved);
      if (!logits.ok()) return logits.status();
      EXPECT_LT(MaxRelativeError(ToVector(*logits), ref.logits[step]), kTolerance)
          << "logits, rank " << rank << " step " << step;
      for (Param& p : (*model)->params().params()) {
        auto full = GatherFull(p, tp, /*grad=*/true);
        if (!full.ok()) return full.status();
        const std::vector<float>& want = ref.grads[step].at(p.spec->name);
        std::vector<float> got = *full;
        if (got.size() > want.size()) {  // a larger padded vocabulary: padding rows get no gradient
          for (size_t i = want.size(); i < got.size(); ++i) EXPECT_EQ(got[i], 0.0f) << p.spec->name;
          got.resize(want.size());
        }
        EXPECT_LT(MaxRelativeError(got, want), kTolerance)
            << p.spec->name << ", rank " << rank << " step " << step;
        for (int64_t i = 0; i < p.value.numel(); ++i) {
          p.value.data<float>()[i] -= kLr * p.grad.data<float>()[i];
        }
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EquivalenceTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool(),
                                            ::testing::Values(Arch::kGpt2, Arch::kLlama,
                                                              Arch::kQwen2, Arch::kMoe,
                                                              Arch::kMoeCapacity)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sp" : "") +
                                  ArchName(std::get<2>(info.param));
                         });

// The Llama-style model really is one: no position table or biases, RMSNorm
// weights only, a separate output layer, K/V projections for 2 groups.
TEST(EquivalenceSanityTest, LlamaParametersAreTheLlamaLayout) {
  const GptConfig config = LlamaConfig(2);
  auto model = GptModel::Create(config, TpGroup{});
  ASSERT_TRUE(model.ok()) << model.status();
  const ParamBuffer& p = (*model)->params();
  EXPECT_FALSE(p.contains(kPositionEmbeddingName));
  EXPECT_FALSE(p.contains(kFinalNormBiasName));
  EXPECT_FALSE(p.contains("layers.0.input_layernorm.bias"));
  EXPECT_FALSE(p.contains("layers.0.attention.qkv.bias"));
  EXPECT_FALSE(p.contains("layers.1.mlp.dense_4h_to_h.bias"));
  EXPECT_TRUE(p.contains(kOutputLayerName));
  EXPECT_TRUE((*model)->output_layer().valid());
  // (4 + 2 x 2) heads of d = 12 rows; [gate; up] of 96 x 48 each.
  EXPECT_EQ(p.at("layers.0.attention.qkv.weight").value.shape(), (core::Shape{96, 48}));
  EXPECT_EQ(p.at("layers.0.mlp.dense_h_to_4h.weight").value.shape(), (core::Shape{2, 96 * 48}));
  EXPECT_EQ(p.at("layers.0.mlp.dense_4h_to_h.weight").value.shape(), (core::Shape{48, 96}));
  // ParameterCount counts the unpadded vocabulary (100; 104 rows held) twice.
  EXPECT_EQ(p.numel(), ParameterCount(config) + 2 * 4 * 48);
}

// Sanity: the test can fail. A model whose TP ranks initialise differently
// (another seed on one rank) must not match.
TEST(EquivalenceSanityTest, DifferentWeightsAreDetected) {
  const GptConfig config = TestConfig();
  const Reference ref = RunReference(config);
  GptConfig other = config;
  other.seed = 43;
  auto model = GptModel::Create(other, TpGroup{});
  ASSERT_TRUE(model.ok());
  Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100);
  Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 200);
  GptModel::Saved saved;
  double loss = 0;
  ASSERT_TRUE((*model)->Forward(0, ids, targets, StepDropout(0), &saved, &loss).ok());
  EXPECT_GT(MaxRelativeError(ToVector(*(*model)->GatherLogits(saved)), ref.logits[0]), kTolerance);
}

// Sanity: attention dropout is really on. The same model and batch without
// it gives other logits, and evaluation mode (training = false) ignores it.
TEST(EquivalenceSanityTest, AttentionDropoutChangesTrainingOutputOnly) {
  const GptConfig config = TestConfig();
  auto model = GptModel::Create(config, TpGroup{});
  ASSERT_TRUE(model.ok());
  Tensor ids = RandomIds(config.seq_length, kBatch, config.vocab_size, 100);
  Tensor targets = RandomIds(config.seq_length, kBatch, config.vocab_size, 200);
  auto logits = [&](DropoutStream d) {
    GptModel::Saved saved;
    double loss = 0;
    EXPECT_TRUE((*model)->Forward(0, ids, targets, d, &saved, &loss).ok());
    return ToVector(*(*model)->GatherLogits(saved));
  };
  DropoutStream on = StepDropout(0), off = StepDropout(0);
  off.attention_p = 0.0f;
  EXPECT_GT(MaxRelativeError(logits(on), logits(off)), kTolerance);
  on.training = off.training = false;
  EXPECT_EQ(MaxRelativeError(logits(on), logits(off)), 0.0);
}

}  // namespace
}  // namespace loom::layers
