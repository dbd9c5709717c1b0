// The Llama-style layers compute Llama's function, against naive double-
// precision loops written from the global layout documented in gpt_config.h
// (the layout the Hugging Face importer maps q_proj/k_proj/v_proj, gate_proj
// and up_proj onto): grouped-query attention with RoPE in the rotate-half
// convention (all or half of each head's dims), and the SwiGLU MLP. The
// equivalence and gradient tests compare Loom with itself; this one pins the
// semantics. Relative error per output tensor (max |diff| / max |ref|) below
// 1e-5: f32 GEMMs and softmax against double loops.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "layers/attention.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/test_util.h"
#include "models/gpt/transformer_block.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;
using testing::MaxRelativeError;
using testing::RandomTensor;
using testing::ToVector;

constexpr double kTolerance = 1e-5;
constexpr int64_t kSeq = 7, kBatch = 2;

GptConfig Llama(float rotary_percent) {
  GptConfig c;
  c.num_layers = 1;
  c.hidden_size = 24;
  c.num_attention_heads = 6;  // d = 4
  c.group_query_attention = true;
  c.num_query_groups = 2;  // 3 query heads per group
  c.normalization = layers::Normalization::kRMSNorm;
  c.position_embedding_type = layers::PositionEmbedding::kRope;
  c.rotary_base = 50.0f;
  c.rotary_percent = rotary_percent;
  c.swiglu = true;
  c.ffn_hidden_size = 20;
  c.add_bias_linear = false;
  c.seq_length = kSeq;
  c.init_method_std = 0.3f;
  c.seed = 17;
  return c;
}

// y[t, r] = Σ_k w[r, k] x[t, k] for rows t of x [T, in], w [out, in] row-major.
std::vector<double> Linear(const std::vector<float>& x, const float* w, int64_t out,
                           int64_t in) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(rows * out, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t r = 0; r < out; ++r) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += double(w[r * in + k]) * x[t * in + k];
      y[t * out + r] = acc;
    }
  }
  return y;
}

// Rotate-half RoPE of one head vector v[d] at position p (first r dims).
void Rotate(double* v, int64_t r, int64_t p, double base) {
  for (int64_t i = 0; i < r / 2; ++i) {
    const double theta = p * std::pow(base, -2.0 * i / r);
    const double a = v[i], b = v[i + r / 2];
    v[i] = a * std::cos(theta) - b * std::sin(theta);
    v[i + r / 2] = b * std::cos(theta) + a * std::sin(theta);
  }
}

class LlamaReferenceTest : public ::testing::TestWithParam<float> {};

TEST_P(LlamaReferenceTest, AttentionIsGroupedQueryAttentionWithRope) {
  const GptConfig c = Llama(GetParam());
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, groups = c.num_query_groups;
  const int64_t d = c.head_dim(), n = heads / groups, r = c.rotary_dim();
  auto buf = ParamBuffer::Create(BlockParamSpecs(c, 0), 0, 1, c.seed);
  ASSERT_TRUE(buf.ok()) << buf.status();
  Param& qkv_w = buf->at("layers.0.attention.qkv.weight");
  Param& dense_w = buf->at("layers.0.attention.dense.weight");
  ASSERT_EQ(qkv_w.value.shape(), (Shape{(heads + 2 * groups) * d, h}));
  ParallelAttention attention(&qkv_w, nullptr, &dense_w, nullptr, AttentionOptionsOf(c),
                              TpGroup{}, CpGroup{}, 0);
  const Tensor x = RandomTensor(Shape{kSeq, kBatch, h}, 5);
  DropoutStream no_dropout;
  no_dropout.training = false;
  ParallelAttention::Saved saved;
  auto out = attention.Forward(x, no_dropout, &saved);
  ASSERT_TRUE(out.ok()) << out.status();

  // Hugging Face's q_proj / k_proj / v_proj rows, per gpt_config.h.
  const std::vector<double> proj =
      Linear(ToVector(x), qkv_w.value.data<float>(), (heads + 2 * groups) * d, h);
  const int64_t width = (heads + 2 * groups) * d;
  auto q_row = [&](int64_t j, int64_t e) { return ((j / n) * (n + 2) + j % n) * d + e; };
  auto k_row = [&](int64_t g, int64_t e) { return (g * (n + 2) + n) * d + e; };
  auto v_row = [&](int64_t g, int64_t e) { return (g * (n + 2) + n + 1) * d + e; };
  std::vector<double> ctx(kSeq * kBatch * heads * d, 0.0);
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t j = 0; j < heads; ++j) {
      const int64_t g = j / n;
      std::vector<double> q(kSeq * d), k(kSeq * d), v(kSeq * d);
      for (int64_t s = 0; s < kSeq; ++s) {
        const double* row = proj.data() + (s * kBatch + b) * width;
        for (int64_t e = 0; e < d; ++e) {
          q[s * d + e] = row[q_row(j, e)];
          k[s * d + e] = row[k_row(g, e)];
          v[s * d + e] = row[v_row(g, e)];
        }
        Rotate(&q[s * d], r, s, c.rotary_base);
        Rotate(&k[s * d], r, s, c.rotary_base);
      }
      for (int64_t s = 0; s < kSeq; ++s) {  // causal softmax attention
        std::vector<double> p(s + 1);
        double max = -1e300, sum = 0;
        for (int64_t t = 0; t <= s; ++t) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += q[s * d + e] * k[t * d + e];
          p[t] = dot / std::sqrt(double(d));
          max = std::max(max, p[t]);
        }
        for (int64_t t = 0; t <= s; ++t) sum += p[t] = std::exp(p[t] - max);
        for (int64_t t = 0; t <= s; ++t) {
          for (int64_t e = 0; e < d; ++e) {
            ctx[((s * kBatch + b) * heads + j) * d + e] += p[t] / sum * v[t * d + e];
          }
        }
      }
    }
  }
  std::vector<float> ctx_f(ctx.begin(), ctx.end());
  const std::vector<double> want = Linear(ctx_f, dense_w.value.data<float>(), h, heads * d);
  EXPECT_LT(MaxRelativeError(ToVector(*out), std::vector<float>(want.begin(), want.end())),
            kTolerance);
  // The kernel's input holds q, k, v per query head: [s, b, heads, 3, d].
  EXPECT_EQ(saved.qkv.shape(), (Shape{kSeq, kBatch, heads * 3 * d}));
}

TEST_P(LlamaReferenceTest, MlpIsSwiglu) {
  const GptConfig c = Llama(GetParam());
  const int64_t h = c.hidden_size, f = c.ffn();
  auto buf = ParamBuffer::Create(BlockParamSpecs(c, 0), 0, 1, c.seed);
  ASSERT_TRUE(buf.ok()) << buf.status();
  Param& up = buf->at("layers.0.mlp.dense_h_to_4h.weight");
  Param& down = buf->at("layers.0.mlp.dense_4h_to_h.weight");
  ASSERT_EQ(up.value.shape(), (Shape{2, f * h}));  // [gate_proj; up_proj], each [f, h]
  ParallelMlp mlp(&up, nullptr, &down, nullptr, TpGroup{}, /*swiglu=*/true);
  const Tensor x = RandomTensor(Shape{kSeq, kBatch, h}, 6);
  ParallelMlp::Saved saved;
  auto out = mlp.Forward(x, &saved);
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> xs = ToVector(x);
  const std::vector<double> gate = Linear(xs, up.value.data<float>(), f, h);
  const std::vector<double> lin = Linear(xs, up.value.data<float>() + f * h, f, h);
  std::vector<float> act(gate.size());
  for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * lin[i];
  const std::vector<double> want = Linear(act, down.value.data<float>(), h, f);
  EXPECT_LT(MaxRelativeError(ToVector(*out), std::vector<float>(want.begin(), want.end())),
            kTolerance);
}

INSTANTIATE_TEST_SUITE_P(RotaryPercent, LlamaReferenceTest, ::testing::Values(1.0f, 0.5f),
                         [](const auto& info) { return info.param == 1.0f ? "full" : "half"; });

}  // namespace
}  // namespace loom::layers
