// Backward passes against central finite differences. For every parameter
// tensor of a small GPT (so every layer: embeddings, LayerNorms, QKV,
// attention, projections, MLP, tied output layer, cross-entropy) and for the
// hidden input of a middle pipeline chunk, the analytic directional
// derivative g·v along a random direction v matches
// (L(p + εv) − L(p − εv)) / 2ε. Hidden dropout is on (fixed masks). The same
// for a Llama-style GPT (RMSNorm, RoPE on half of each head's dims, SwiGLU,
// 4 heads in 2 K/V groups, untied output layer, no biases), and for MoE
// layers (router, experts, load-balancing and z losses; dropless and with a
// capacity).
#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Tensor;

// f32 forward passes along unit directions: ε = 1e-2 balances truncation
// against rounding; the derivatives agree to about 1e-3 relative (absolute
// floor 1e-6 for near-zero ones), asserted at 1e-2.
constexpr double kEps = 1e-2;
constexpr double kTolerance = 1e-2;

// The architectures checked: GPT-2, Llama-style, Qwen2-style (Llama with a
// QKV bias only), and Llama-style with an MoE MLP in every layer (4 experts,
// top-2, the load-balancing and z losses weighted well above f32 noise),
// dropless or with a capacity that drops.
enum class Arch { kGpt2, kLlama, kQwen2, kMoe, kMoeCapacity };

GptConfig SmallConfig(Arch arch) {
  const bool llama = arch != Arch::kGpt2;
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 6;
  c.vocab_size = 20;
  c.make_vocab_size_divisible_by = 4;
  c.init_method_std = 0.2f;  // larger weights: gradients well above f32 noise
  c.seed = 3;
  if (llama) {
    c.normalization = layers::Normalization::kRMSNorm;
    c.position_embedding_type = layers::PositionEmbedding::kRope;
    c.rotary_base = 100.0f;  // faster rotations over 6 positions
    c.rotary_percent = 0.5f;  // head dim 4: dims 0..1 rotated, 2..3 not
    c.swiglu = true;
    c.ffn_hidden_size = 24;
    c.num_attention_heads = 4;
    c.group_query_attention = true;
    c.num_query_groups = 2;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
    c.add_qkv_bias = arch == Arch::kQwen2;
  }
  if (arch == Arch::kMoe || arch == Arch::kMoeCapacity) {
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_aux_loss_coeff = 0.1f;
    c.moe_z_loss_coeff = 0.01f;
    if (arch == Arch::kMoeCapacity) c.moe_expert_capacity_factor = 0.75f;
  }
  return c;
}

class GradientCheckTest : public ::testing::TestWithParam<Arch> {};

// What the backward differentiates: the LM loss plus every MoE layer's
// load-balancing and z losses.
double Objective(const GptModel::Saved& saved, double lm_loss) {
  double total = lm_loss;
  for (const TransformerBlock::Saved& b : saved.blocks) {
    total += b.moe.routing.aux_loss + b.moe.routing.z_loss;
  }
  return total;
}

// The experts every MoE layer chose, to be sure a finite-difference step did
// not change the routing (the objective is not differentiable there).
// Per token the set of (expert, kept) pairs: the order of a token's K
// choices is not part of the function (two nearly equal logits may swap).
std::vector<int32_t> Choices(const GptModel::Saved& saved) {
  std::vector<int32_t> all;
  for (const TransformerBlock::Saved& b : saved.blocks) {
    const Routing& r = b.moe.routing;
    for (int64_t t = 0; t < r.tokens; ++t) {
      std::vector<int32_t> token;
      for (int k = 0; k < r.topk; ++k) token.push_back(2 * r.expert[t * r.topk + k] + r.kept(t, k));
      std::sort(token.begin(), token.end());
      all.insert(all.end(), token.begin(), token.end());
    }
  }
  return all;
}

DropoutStream Dropout() {
  DropoutStream d;
  d.hidden_p = 0.2f;
  d.seed = 11;
  d.stream = 5;
  return d;
}

double Loss(GptModel& model, const Tensor& ids, const Tensor& targets,
            const std::vector<int32_t>* routing = nullptr) {
  GptModel::Saved saved;
  double loss = 0;
  EXPECT_TRUE(model.Forward(0, ids, targets, Dropout(), &saved, &loss).ok());
  if (routing != nullptr) {
    EXPECT_EQ(Choices(saved), *routing) << "a step changed the routing";
  }
  return Objective(saved, loss);
}

TEST_P(GradientCheckTest, EveryParameterTensorMatchesFiniteDifferences) {
  const GptConfig config = SmallConfig(GetParam());
  auto model = GptModel::Create(config, TpGroup{});
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor ids = testing::RandomIds(config.seq_length, 2, config.vocab_size, 1);
  Tensor targets = testing::RandomIds(config.seq_length, 2, config.vocab_size, 2);
  GptModel::Saved saved;
  double loss = 0;
  ASSERT_TRUE((*model)->Forward(0, ids, targets, Dropout(), &saved, &loss).ok());
  ASSERT_TRUE((*model)->Backward(0, Tensor(), 1.0f, Dropout(), saved).ok());
  const std::vector<int32_t> routing = Choices(saved);

  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  for (Param& p : (*model)->params().params()) {
    float* w = p.value.data<float>();
    const float* g = p.grad.data<float>();
    std::vector<float> v(p.value.numel()), orig(w, w + p.value.numel());
    double analytic = 0, norm = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = normal(rng);
      norm += double(v[i]) * v[i];
    }
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] /= std::sqrt(norm);  // a unit direction: a step of length ε
      analytic += double(g[i]) * v[i];
    }
    for (size_t i = 0; i < v.size(); ++i) w[i] = orig[i] + kEps * v[i];
    const double plus = Loss(**model, ids, targets, &routing);
    for (size_t i = 0; i < v.size(); ++i) w[i] = orig[i] - kEps * v[i];
    const double minus = Loss(**model, ids, targets, &routing);
    std::copy(orig.begin(), orig.end(), w);
    const double numeric = (plus - minus) / (2 * kEps);
    EXPECT_NEAR(analytic, numeric, kTolerance * std::max(1e-3, std::fabs(numeric)))
        << p.spec->name;
  }
}

TEST_P(GradientCheckTest, HiddenInputGradientOfAMiddleChunk) {
  // A chunk with layer 1 and the head, fed a hidden state (as a later
  // pipeline stage is): its input gradient must match finite differences.
  const GptConfig config = SmallConfig(GetParam());
  auto model = GptModel::Create(config, TpGroup{}, {ChunkSpec{1, 1, false, true}});
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor x = testing::RandomTensor(core::Shape{config.seq_length, 2, config.hidden_size}, 4);
  Tensor targets = testing::RandomIds(config.seq_length, 2, config.vocab_size, 2);
  GptModel::Saved saved;
  double loss = 0;
  ASSERT_TRUE((*model)->Forward(0, x, targets, Dropout(), &saved, &loss).ok());
  auto dx = (*model)->Backward(0, Tensor(), 1.0f, Dropout(), saved);
  ASSERT_TRUE(dx.ok()) << dx.status();
  ASSERT_EQ(dx->shape(), x.shape());

  std::mt19937_64 rng(10);
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<float> v(x.numel());
    double analytic = 0, norm = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = normal(rng);
      norm += double(v[i]) * v[i];
    }
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] /= std::sqrt(norm);
      analytic += double(dx->data<float>()[i]) * v[i];
    }
    auto shifted = [&](double sign) {
      Tensor y = *x.Clone();
      for (size_t i = 0; i < v.size(); ++i) y.data<float>()[i] += sign * kEps * v[i];
      GptModel::Saved s;
      double l = 0;
      EXPECT_TRUE((*model)->Forward(0, y, targets, Dropout(), &s, &l).ok());
      EXPECT_EQ(Choices(s), Choices(saved)) << "a step changed the routing";
      return Objective(s, l);
    };
    const double numeric = (shifted(1) - shifted(-1)) / (2 * kEps);
    EXPECT_NEAR(analytic, numeric, kTolerance * std::max(1e-3, std::fabs(numeric)));
  }
}

TEST_P(GradientCheckTest, WrongGradientIsCaught) {
  // The check can fail: scale one gradient and it must disagree.
  const GptConfig config = SmallConfig(GetParam());
  auto model = GptModel::Create(config, TpGroup{});
  ASSERT_TRUE(model.ok());
  Tensor ids = testing::RandomIds(config.seq_length, 2, config.vocab_size, 1);
  Tensor targets = testing::RandomIds(config.seq_length, 2, config.vocab_size, 2);
  GptModel::Saved saved;
  double loss = 0;
  ASSERT_TRUE((*model)->Forward(0, ids, targets, Dropout(), &saved, &loss).ok());
  ASSERT_TRUE((*model)->Backward(0, Tensor(), 1.0f, Dropout(), saved).ok());
  Param& p = (*model)->params().at(config.moe() ? "layers.0.mlp.router.weight"
                                                 : "layers.0.mlp.dense_h_to_4h.weight");
  float* w = p.value.data<float>();
  double analytic = 0;
  for (int64_t i = 0; i < p.value.numel(); ++i) analytic += 1.1 * p.grad.data<float>()[i];
  std::vector<float> orig(w, w + p.value.numel());
  for (int64_t i = 0; i < p.value.numel(); ++i) w[i] = orig[i] + kEps;
  const double plus = Loss(**model, ids, targets);
  for (int64_t i = 0; i < p.value.numel(); ++i) w[i] = orig[i] - kEps;
  const double minus = Loss(**model, ids, targets);
  const double numeric = (plus - minus) / (2 * kEps);
  EXPECT_GT(std::fabs(analytic - numeric), kTolerance * std::fabs(numeric));
}

INSTANTIATE_TEST_SUITE_P(Architectures, GradientCheckTest,
                         ::testing::Values(Arch::kGpt2, Arch::kLlama, Arch::kQwen2,
                                           Arch::kMoe, Arch::kMoeCapacity),
                         [](const auto& info) {
                           switch (info.param) {
                             case Arch::kGpt2: return "Gpt2";
                             case Arch::kLlama: return "Llama";
                             case Arch::kQwen2: return "Qwen2";
                             case Arch::kMoe: return "Moe";
                             case Arch::kMoeCapacity: return "MoeCapacity";
                           }
                           return "";
                         });

}  // namespace
}  // namespace loom::layers
