// The MoE router and dispatch against an independent double-precision
// reference: top-k choices, combine weights, tokens per expert, the Switch
// load-balancing loss and the z-loss; the capacity keeps each expert's most
// probable assignments and pads; the dispatched rows are the tokens' rows;
// experts (and whole layers) that receive no token work; the MoE flags are
// checked with errors naming them. Gradients: //models/gpt:gradient_check_test
// (finite differences) and //models/gpt:equivalence_test (TP 1-4, SP).

#include "layers/moe.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/test_util.h"

namespace loom::layers {
namespace {

using core::Tensor;

std::vector<float> RandomLogits(int64_t T, int64_t E, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(T * E);
  for (float& x : l) x = normal(rng);
  return l;
}

MoeOptions Options(int64_t E, int64_t K) {
  MoeOptions o;
  o.experts = E;
  o.topk = K;
  o.aux_loss_coeff = 0.01f;
  o.z_loss_coeff = 0.001f;
  return o;
}

TEST(RouteTest, MatchesADoubleReference) {
  const int64_t T = 37, E = 8, K = 2;
  const std::vector<float> logits = RandomLogits(T, E, 1);
  const MoeOptions o = Options(E, K);
  auto r = Route(logits.data(), T, o);
  ASSERT_TRUE(r.ok()) << r.status();

  // The reference, written out: sort each token's experts by logit, softmax
  // over the first K, count, and the two losses from their definitions.
  std::vector<double> count(E, 0), mean_prob(E, 0);
  double z = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<double, int>> v;
    for (int e = 0; e < E; ++e) v.push_back({-double(logits[t * E + e]), e});
    std::sort(v.begin(), v.end());
    double denom = 0;
    for (int k = 0; k < K; ++k) denom += std::exp(-v[k].first + v[0].first);
    for (int k = 0; k < K; ++k) {
      EXPECT_EQ(r->expert[t * K + k], v[k].second) << "token " << t;
      EXPECT_NEAR(r->prob[t * K + k], std::exp(-v[k].first + v[0].first) / denom, 1e-6);
      EXPECT_TRUE(r->kept(t, k));  // dropless
      count[v[k].second] += 1;
    }
    double all = 0;
    for (int e = 0; e < E; ++e) all += std::exp(double(logits[t * E + e]));
    for (int e = 0; e < E; ++e) mean_prob[e] += std::exp(double(logits[t * E + e])) / all / T;
    z += std::log(all) * std::log(all) / T;
  }
  double aux = 0;
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(r->tokens_per_expert[e], count[e]);
    aux += count[e] / (T * K) * mean_prob[e];  // f_e · P_e
  }
  aux *= E * o.aux_loss_coeff;
  EXPECT_NEAR(r->aux_loss, aux, 1e-12 + 1e-9 * aux);
  EXPECT_NEAR(r->z_loss, o.z_loss_coeff * z, 1e-9 * o.z_loss_coeff * z);
  EXPECT_EQ(r->dropped, 0);
  EXPECT_EQ(static_cast<int64_t>(r->row_token.size()), T * K);
}

TEST(RouteTest, RowsAreGroupedByExpertInTokenOrder) {
  const int64_t T = 50, E = 6, K = 3;
  const std::vector<float> logits = RandomLogits(T, E, 2);
  auto r = Route(logits.data(), T, Options(E, K));
  ASSERT_TRUE(r.ok());
  std::vector<int> seen(T * K, 0);
  for (int64_t e = 0; e < E; ++e) {
    int32_t last = -1;
    for (int64_t row = r->expert_rows[e]; row < r->expert_rows[e + 1]; ++row) {
      const int32_t t = r->row_token[row];
      EXPECT_GT(t, last) << "expert " << e;  // token order, each token once
      last = t;
      int k = 0;
      while (k < K && r->expert[t * K + k] != e) ++k;
      ASSERT_LT(k, K) << "row " << row << " holds token " << t << " not routed to " << e;
      EXPECT_EQ(r->row[t * K + k], row);
      ++seen[t * K + k];
    }
  }
  for (int x : seen) EXPECT_EQ(x, 1);  // every assignment exactly once
}

TEST(RouteTest, CapacityKeepsTheMostProbableAndPads) {
  // Every token prefers expert 0, with a known margin: expert 0 can take
  // ceil(T·K/E · 0.5) = 5 of its 10 assignments and keeps the 5 with the
  // largest weight (the tokens with the largest margin).
  const int64_t T = 10, E = 4, K = 2;
  std::vector<float> logits(T * E, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    logits[t * E + 0] = 1.0f + 0.1f * float((t * 7) % T);  // distinct margins
    logits[t * E + 1 + t % 3] = 0.5f;                      // the second choice
  }
  MoeOptions o = Options(E, K);
  o.capacity_factor = 0.5f;
  o.pad_to_capacity = true;
  auto r = Route(logits.data(), T, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->capacity, 3);  // ceil(10·2/4 · 0.5) = ceil(2.5)
  std::vector<std::pair<float, int64_t>> first;  // expert 0's weights
  for (int64_t t = 0; t < T; ++t) first.push_back({-r->prob[t * K], t});
  std::sort(first.begin(), first.end());
  for (int i = 0; i < T; ++i) {
    EXPECT_EQ(r->kept(first[i].second, 0), i < 3) << "token " << first[i].second;
  }
  int64_t kept = 0;
  for (int64_t slot = 0; slot < T * K; ++slot) kept += r->row[slot] >= 0;
  EXPECT_EQ(kept + r->dropped, T * K);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(r->expert_rows[e + 1] - r->expert_rows[e], 3) << "padded to the capacity";
  }
  EXPECT_EQ(std::count(r->row_token.begin(), r->row_token.end(), -1), E * 3 - kept);
}

TEST(RouteTest, BadOptionsAreRefused) {
  const std::vector<float> logits(8, 0.0f);
  EXPECT_FALSE(Route(logits.data(), 2, Options(4, 5)).ok());
  EXPECT_FALSE(Route(logits.data(), 2, Options(0, 1)).ok());
}

GptConfig MoeConfig() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 20;
  c.make_vocab_size_divisible_by = 4;
  c.add_bias_linear = false;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_aux_loss_coeff = 0.01f;
  return c;
}

// Experts that get no token, and a layer whose every token goes to one
// expert, run forward and backward; the idle experts' gradients stay zero.
TEST(MoeMlpTest, ExpertsWithoutTokensWork) {
  GptConfig c = MoeConfig();
  auto model = GptModel::Create(c, TpGroup{});
  ASSERT_TRUE(model.ok()) << model.status();
  // A zero router: every logit ties and the lower experts win, so every
  // token goes to experts 0 and 1 and experts 2 and 3 get nothing.
  for (int layer = 0; layer < 2; ++layer) {
    Param& router = (*model)->params().at("layers." + std::to_string(layer) + ".mlp.router.weight");
    std::fill(router.value.data<float>(), router.value.data<float>() + router.value.numel(), 0.0f);
  }
  Tensor ids = testing::RandomIds(c.seq_length, 2, c.vocab_size, 1);
  GptModel::Saved saved;
  double loss = 0;
  ASSERT_TRUE((*model)->Forward(0, ids, ids, DropoutStream{}, &saved, &loss).ok());
  ASSERT_TRUE(std::isfinite(loss));
  for (const auto& b : saved.blocks) {
    ASSERT_EQ(b.moe.routing.tokens_per_expert.size(), 4u);
    for (int e = 0; e < 4; ++e) {  // 8 x 2 tokens, top-2: all to experts 0 and 1
      EXPECT_EQ(b.moe.routing.tokens_per_expert[e], e < 2 ? 16 : 0) << "expert " << e;
    }
  }
  ASSERT_TRUE((*model)->params().ZeroGrads().ok());
  ASSERT_TRUE((*model)->Backward(0, Tensor(), 1.0f, DropoutStream{}, saved).ok());
  for (int layer = 0; layer < 2; ++layer) {
    for (int e = 0; e < 4; ++e) {
      const Param& p = (*model)->params().at("layers." + std::to_string(layer) + ".mlp.experts." +
                                             std::to_string(e) + ".dense_4h_to_h.weight");
      double norm = 0;
      for (int64_t i = 0; i < p.grad.numel(); ++i) norm += std::fabs(p.grad.data<float>()[i]);
      if (e < 2) {
        EXPECT_GT(norm, 0) << "expert " << e;
      } else {
        EXPECT_EQ(norm, 0) << "expert " << e << " saw no token";
      }
    }
  }
}

// --moe-grouped-gemm runs the experts side by side: the same loss and
// gradients as one expert after the other.
TEST(MoeMlpTest, GroupedGemmComputesTheSame) {
  auto run = [](bool grouped, double* loss, std::map<std::string, std::vector<float>>* grads) {
    GptConfig c = MoeConfig();
    c.num_experts = 8;
    c.moe_grouped_gemm = grouped;
    c.moe_z_loss_coeff = 0.01f;
    auto model = GptModel::Create(c, TpGroup{});
    ASSERT_TRUE(model.ok()) << model.status();
    Tensor ids = testing::RandomIds(c.seq_length, 2, c.vocab_size, 3);
    GptModel::Saved saved;
    ASSERT_TRUE((*model)->Forward(0, ids, ids, DropoutStream{}, &saved, loss).ok());
    ASSERT_TRUE((*model)->Backward(0, Tensor(), 1.0f, DropoutStream{}, saved).ok());
    for (const Param& p : (*model)->params().params()) (*grads)[p.spec->name] = testing::ToVector(p.grad);
  };
  double loop_loss = 0, grouped_loss = 0;
  std::map<std::string, std::vector<float>> loop, grouped;
  run(false, &loop_loss, &loop);
  run(true, &grouped_loss, &grouped);
  EXPECT_NEAR(grouped_loss, loop_loss, 1e-6 * loop_loss);
  for (const auto& [name, want] : loop) {
    EXPECT_LT(testing::MaxRelativeError(grouped.at(name), want), 1e-5) << name;
  }
}

TEST(MoeConfigTest, FlagsAreChecked) {
  auto message = [](GptConfig c) { return std::string(ValidateLayout(c, 1, false).message()); };
  GptConfig c = MoeConfig();
  EXPECT_EQ(message(c), "");
  c.moe_router_topk = 5;
  EXPECT_NE(message(c).find("--moe-router-topk (5) must lie in [1, --num-experts (4)]"),
            std::string::npos);
  c = MoeConfig();
  c.add_bias_linear = true;
  EXPECT_NE(message(c).find("--disable-bias-linear"), std::string::npos);
  c = MoeConfig();
  c.moe_pad_expert_input_to_capacity = true;
  EXPECT_NE(message(c).find("--moe-pad-expert-input-to-capacity needs"), std::string::npos);
  c = MoeConfig();
  c.moe_layer_freq = 0;
  EXPECT_NE(message(c).find("--moe-layer-freq (0)"), std::string::npos);
  // The parameter count: two MoE layers of 4 experts instead of one MLP each.
  GptConfig dense = MoeConfig();
  dense.num_experts = 0;
  const int64_t mlp = 2 * 16 * 64;  // fc1 + fc2, ffn 64
  EXPECT_EQ(ParameterCount(MoeConfig()) - ParameterCount(dense), 2 * (3 * mlp + 4 * 16));
  // A token uses 2 of the 4 experts: one MLP more than dense, and the router.
  EXPECT_EQ(ActiveParameterCount(MoeConfig()) - ParameterCount(dense), 2 * (mlp + 4 * 16));
}

}  // namespace
}  // namespace loom::layers
