// The MoE kernels against the host loops of layers/moe.cc they replace
// (copied here as the oracle): bitwise, on ragged shapes, with ties, a
// capacity (padded or not), experts without tokens and no tokens at all;
// bad arguments are refused with the shared InvalidArgument.

#include "core/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu {
namespace {

using testing::IsInvalidArgument;

// ---- the oracle: layers/moe.cc's host code before the kernels
void Softmax(const float* x, int64_t n, std::vector<double>* out, double* lse = nullptr) {
  double max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, double(x[i]));
  double sum = 0;
  out->resize(n);
  for (int64_t i = 0; i < n; ++i) sum += (*out)[i] = std::exp(double(x[i]) - max);
  for (int64_t i = 0; i < n; ++i) (*out)[i] /= sum;
  if (lse != nullptr) *lse = max + std::log(sum);
}

struct Routed {
  std::vector<int32_t> expert, row, row_token;
  std::vector<float> prob;
  std::vector<double> stats;  // counts, score sums, z sum
};

Routed RouteOracle(const float* logits, int64_t T, int64_t E, int64_t K, int64_t capacity,
                   bool pad) {
  Routed r;
  r.expert.resize(T * K);
  r.prob.resize(T * K);
  r.row.assign(T * K, -1);
  std::vector<int64_t> counts(E, 0);
  std::vector<int32_t> order(E);
  std::vector<double> p, all;
  double z_sum = 0;
  std::vector<double> score_sum(E, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [l](int32_t a, int32_t b) {
      return l[a] > l[b] || (l[a] == l[b] && a < b);
    });
    std::vector<float> chosen(K);
    for (int k = 0; k < K; ++k) chosen[k] = l[order[k]];
    Softmax(chosen.data(), K, &p);
    for (int k = 0; k < K; ++k) {
      r.expert[t * K + k] = order[k];
      r.prob[t * K + k] = static_cast<float>(p[k]);
      ++counts[order[k]];
    }
    double lse = 0;
    Softmax(l, E, &all, &lse);
    for (int64_t e = 0; e < E; ++e) score_sum[e] += all[e];
    z_sum += lse * lse;
  }
  for (int64_t e = 0; e < E; ++e) r.stats.push_back(double(counts[e]));
  for (int64_t e = 0; e < E; ++e) r.stats.push_back(score_sum[e]);
  r.stats.push_back(z_sum);
  std::vector<std::vector<int64_t>> by_expert(E);
  for (int64_t slot = 0; slot < T * K; ++slot) by_expert[r.expert[slot]].push_back(slot);
  if (capacity > 0) {
    for (auto& slots : by_expert) {
      if (static_cast<int64_t>(slots.size()) <= capacity) continue;
      std::stable_sort(slots.begin(), slots.end(),
                       [&](int64_t a, int64_t b) { return r.prob[a] > r.prob[b]; });
      slots.resize(capacity);
      std::sort(slots.begin(), slots.end());
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = static_cast<int64_t>(by_expert[e].size());
    const int64_t rows = pad && capacity > 0 ? capacity : n;
    for (int64_t i = 0; i < rows; ++i) {
      if (i < n) {
        const int64_t slot = by_expert[e][i];
        r.row[slot] = static_cast<int32_t>(r.row_token.size());
        r.row_token.push_back(static_cast<int32_t>(slot / K));
      } else {
        r.row_token.push_back(-1);
      }
    }
  }
  return r;
}

// ---- helpers
std::vector<float> RandomLogits(int64_t n, uint64_t seed, bool ties) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(n);
  // With ties: values on a coarse grid, so equal logits are common.
  for (float& x : l) x = ties ? std::round(normal(rng)) : normal(rng);
  return l;
}

template <typename T>
std::vector<T> Vec(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

Tensor I32(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = *Tensor::Empty(s, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor F32(const Shape& s, const std::vector<float>& v) {
  Tensor t = *Tensor::Empty(s, DType::kF32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

struct Case {
  int64_t T, E, K, capacity;
  bool pad, ties;
};

const Case kCases[] = {
    {37, 8, 2, 0, false, false}, {50, 6, 3, 0, false, true}, {21, 5, 1, 0, false, false},
    {40, 4, 2, 10, true, false}, {40, 4, 2, 7, false, true}, {1, 3, 3, 0, false, false},
    {0, 4, 2, 0, false, false},
};

struct Routing {
  Tensor expert, prob, stats, row, row_token;
};

Routing RouteWithKernels(const std::vector<float>& l, const Case& c, int64_t n_rows) {
  Routing r;
  MoeRouteOptions o{c.E, c.K, c.capacity, c.pad};
  Tensor logits = F32(Shape{c.T, c.E}, l);
  r.expert = *Tensor::Empty(Shape{c.T, c.K}, DType::kI32);
  r.prob = *Tensor::Empty(Shape{c.T, c.K}, DType::kF32);
  r.stats = *Tensor::Empty(Shape{2 * c.E + 1}, DType::kF64);
  EXPECT_TRUE(MoeRouteTopK(logits, o, &r.expert, &r.prob, &r.stats).ok());
  r.row = *Tensor::Empty(Shape{c.T, c.K}, DType::kI32);
  r.row_token = *Tensor::Empty(Shape{n_rows}, DType::kI32);
  const absl::Status s = MoeRouteLayout(r.expert, r.prob, o, &r.row, &r.row_token);
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

TEST(MoeKernelsTest, RoutingIsTheHostRoutingBitwise) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " E " << c.E << " K " << c.K << " cap "
                                    << c.capacity << (c.pad ? " padded" : ""));
    const std::vector<float> l = RandomLogits(c.T * c.E, c.T + 7 * c.E, c.ties);
    const Routed want = RouteOracle(l.data(), c.T, c.E, c.K, c.capacity, c.pad);
    Routing got = RouteWithKernels(l, c, static_cast<int64_t>(want.row_token.size()));
    EXPECT_EQ(Vec<int32_t>(got.expert), want.expert);
    EXPECT_EQ(Vec<float>(got.prob), want.prob);
    const std::vector<double> st = Vec<double>(got.stats);
    for (size_t i = 0; i < st.size(); ++i) {
      EXPECT_EQ(st[i], want.stats[i]) << "stats[" << i << "] " << std::hexfloat << st[i] << " vs "
                                      << want.stats[i];
    }
    EXPECT_EQ(Vec<int32_t>(got.row), want.row);
    EXPECT_EQ(Vec<int32_t>(got.row_token), want.row_token);
  }
}

// Every logit ties: experts 0..K-1 take every token, the others none.
TEST(MoeKernelsTest, AllTiesGoToTheLowerExperts) {
  const Case c{9, 5, 2, 0, false, false};
  const std::vector<float> l(c.T * c.E, 0.0f);
  Routing got = RouteWithKernels(l, c, c.T * c.K);
  const std::vector<double> st = Vec<double>(got.stats);
  EXPECT_EQ(st[0], 9);
  EXPECT_EQ(st[1], 9);
  EXPECT_EQ(st[2], 0);
  for (int64_t t = 0; t < c.T; ++t) {
    EXPECT_EQ(got.expert.data<int32_t>()[t * 2], 0);
    EXPECT_EQ(got.expert.data<int32_t>()[t * 2 + 1], 1);
  }
}

TEST(MoeKernelsTest, PermuteCombineAndBackwardsAreTheHostLoopsBitwise) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " E " << c.E << " K " << c.K);
    const int64_t h = 13;
    const std::vector<float> l = RandomLogits(c.T * c.E, c.T + 3, c.ties);
    const Routed r = RouteOracle(l.data(), c.T, c.E, c.K, c.capacity, c.pad);
    const int64_t N = static_cast<int64_t>(r.row_token.size()), T = c.T, K = c.K;
    const Tensor x = testing::Random(Shape{T, h}, 1);
    const Tensor rows = testing::Random(Shape{N, h}, 2);
    const Tensor dy = testing::Random(Shape{T, h}, 3);
    const Tensor prob = F32(Shape{T, K}, r.prob), row = I32(Shape{T, K}, r.row);
    const Tensor row_token = I32(Shape{N}, r.row_token);

    // Permute: the embedding gather with zero rows for padding.
    Tensor out = *Tensor::Empty(Shape{N, h}, DType::kF32);
    LOOM_ASSERT_OK(MoePermute(x, row_token, &out));
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        const float want = r.row_token[i] < 0 ? 0.0f : x.data<float>()[r.row_token[i] * h + j];
        ASSERT_EQ(out.data<float>()[i * h + j], want);
      }
    }
    // Its backward: the scatter-add over rows in row order, from zero.
    std::vector<float> dx_want(T * h, 0.0f);
    for (int64_t i = 0; i < N; ++i) {
      if (r.row_token[i] < 0) continue;
      for (int64_t j = 0; j < h; ++j) dx_want[r.row_token[i] * h + j] += rows.data<float>()[i * h + j];
    }
    Tensor dx = *Tensor::Empty(Shape{T, h}, DType::kF32);
    LOOM_ASSERT_OK(MoePermuteBackward(rows, row, &dx));
    EXPECT_EQ(Vec<float>(dx), dx_want);

    // Combine: y_t = Σ_k p · row in k order from zero.
    std::vector<float> y_want(T * h, 0.0f);
    std::vector<float> drows_want(N * h, 0.0f), dprob_want(T * K, 0.0f);
    const float* rp = rows.data<float>();
    const float* g = dy.data<float>();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int32_t rw = r.row[t * K + k];
        if (rw < 0) continue;
        const float p = r.prob[t * K + k];
        for (int64_t j = 0; j < h; ++j) y_want[t * h + j] += p * rp[rw * h + j];
        double dot = 0;
        for (int64_t j = 0; j < h; ++j) {
          drows_want[rw * h + j] = p * g[t * h + j];
          dot += double(g[t * h + j]) * rp[rw * h + j];
        }
        dprob_want[t * K + k] = static_cast<float>(dot);
      }
    }
    Tensor y = *Tensor::Empty(Shape{T, h}, DType::kF32);
    LOOM_ASSERT_OK(MoeCombineForward(rows, prob, row, &y));
    EXPECT_EQ(Vec<float>(y), y_want);
    Tensor drows = *Tensor::Empty(Shape{N, h}, DType::kF32);
    Tensor dprob = *Tensor::Empty(Shape{T, K}, DType::kF32);
    LOOM_ASSERT_OK(MoeCombineBackward(dy, rows, prob, row, &drows, &dprob));
    EXPECT_EQ(Vec<float>(drows), drows_want);
    EXPECT_EQ(Vec<float>(dprob), dprob_want);
  }
}

TEST(MoeKernelsTest, RouterBackwardIsTheHostLoopBitwise) {
  for (const Case& c : kCases) {
    for (int losses = 0; losses < 4; ++losses) {  // neither, aux, z, both
      SCOPED_TRACE(::testing::Message() << "T " << c.T << " E " << c.E << " losses " << losses);
      const int64_t T = c.T, E = c.E, K = c.K;
      const std::vector<float> l = RandomLogits(T * E, T + 11, c.ties);
      const Routed r = RouteOracle(l.data(), T, E, K, c.capacity, c.pad);
      const Tensor dprob = testing::Random(Shape{T, K}, 5);
      const bool aux = losses & 1, z = losses & 2;
      const float w = 0.75f, z_coeff = 0.001f;
      std::vector<double> g(E, 0.0);
      for (int64_t e = 0; e < E; ++e) g[e] = 1e-3 * double(e + 1) * (aux ? 1 : 0);
      // The oracle: RouterBackward's loop.
      std::vector<float> want(T * E, 0.0f);
      const float* dp = dprob.data<float>();
      std::vector<double> s;
      for (int64_t t = 0; t < T; ++t) {
        float* d = want.data() + t * E;
        double dot = 0;
        for (int k = 0; k < K; ++k) dot += double(r.prob[t * K + k]) * dp[t * K + k];
        for (int k = 0; k < K; ++k) {
          const double pk = r.prob[t * K + k];
          d[r.expert[t * K + k]] += static_cast<float>(pk * (double(dp[t * K + k]) - dot));
        }
        if (!z && !aux) continue;
        double lse = 0;
        Softmax(l.data() + t * E, E, &s, &lse);
        double sg = 0;
        for (int64_t e = 0; e < E; ++e) sg += s[e] * g[e];
        const double zg = z ? double(w) * z_coeff * 2.0 * lse / double(T) : 0.0;
        for (int64_t e = 0; e < E; ++e) d[e] += static_cast<float>(s[e] * (g[e] - sg) + zg * s[e]);
      }
      MoeRouterBackwardOptions o;
      o.aux_loss = aux;
      o.z_loss = z;
      o.z_scale = double(w) * z_coeff * 2.0;
      Tensor aux_grad = *Tensor::Empty(Shape{E}, DType::kF64);
      std::copy(g.begin(), g.end(), aux_grad.data<double>());
      Tensor dlogits = *Tensor::Empty(Shape{T, E}, DType::kF32);
      LOOM_ASSERT_OK(MoeRouterBackward(F32(Shape{T, E}, l), I32(Shape{T, K}, r.expert),
                                       F32(Shape{T, K}, r.prob), dprob, aux_grad, o, &dlogits));
      EXPECT_EQ(Vec<float>(dlogits), want);
    }
  }
}

TEST(MoeKernelsTest, BadArgumentsAreRefused) {
  const Tensor logits = testing::Random(Shape{5, 4}, 1);
  Tensor expert = *Tensor::Empty(Shape{5, 2}, DType::kI32);
  Tensor prob = *Tensor::Empty(Shape{5, 2}, DType::kF32);
  Tensor stats = *Tensor::Empty(Shape{9}, DType::kF64);
  EXPECT_TRUE(IsInvalidArgument(MoeRouteTopK(logits, {4, 5}, &expert, &prob, &stats),
                                {"MoeRouteTopK", "top-5 of 4"}));
  EXPECT_TRUE(IsInvalidArgument(MoeRouteTopK(logits, {5, 2}, &expert, &prob, &stats),
                                {"MoeRouteTopK", "logits", "[T, 5]"}));
  Tensor short_stats = *Tensor::Empty(Shape{8}, DType::kF64);
  EXPECT_TRUE(IsInvalidArgument(MoeRouteTopK(logits, {4, 2}, &expert, &prob, &short_stats),
                                {"stats", "9 elements"}));
  LOOM_ASSERT_OK(MoeRouteTopK(logits, {4, 2}, &expert, &prob, &stats));
  Tensor row = *Tensor::Empty(Shape{5, 2}, DType::kI32);
  Tensor row_token = *Tensor::Empty(Shape{9}, DType::kI32);  // the layout has 10
  EXPECT_TRUE(IsInvalidArgument(MoeRouteLayout(expert, prob, {4, 2}, &row, &row_token),
                                {"MoeRouteLayout", "10 rows"}));
  EXPECT_TRUE(IsInvalidArgument(MoeRouteLayout(expert, prob, {4, 2, 0, true}, &row, &row_token),
                                {"MoeRouteLayout", "padding needs one"}));
  const Tensor x = testing::Random(Shape{5, 3}, 2);
  Tensor out = *Tensor::Empty(Shape{2, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(MoePermute(x, I32(Shape{2}, {0, 5}), &out),
                                {"MoePermute", "row_token[1] = 5"}));
  Tensor wide = *Tensor::Empty(Shape{2, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(MoePermute(x, I32(Shape{2}, {0, 1}), &wide),
                                {"MoePermute", "out", "[2, 3]"}));
  const Tensor rows = testing::Random(Shape{2, 3}, 3);
  Tensor y = *Tensor::Empty(Shape{5, 3}, DType::kF32);
  const Tensor p2 = testing::Random(Shape{5, 2}, 4);
  EXPECT_TRUE(IsInvalidArgument(
      MoeCombineForward(rows, p2, I32(Shape{5, 2}, {0, 1, 2, -1, -1, -1, -1, -1, -1, -1}), &y),
      {"MoeCombineForward", "row[2] = 2"}));
  EXPECT_TRUE(IsInvalidArgument(MoeCombineForward(rows, p2, I32(Shape{5, 1}, {0, 1, -1, -1, -1}), &y),
                                {"MoeCombineForward", "row", "as prob"}));
  Tensor dx = *Tensor::Empty(Shape{4, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(
      MoePermuteBackward(rows, I32(Shape{5, 2}, {0, 1, -1, -1, -1, -1, -1, -1, -1, -1}), &dx),
      {"MoePermuteBackward", "dx", "[5, 3]"}));
  Tensor dlogits = *Tensor::Empty(Shape{5, 4}, DType::kF32);
  MoeRouterBackwardOptions ob;
  ob.aux_loss = true;
  EXPECT_TRUE(IsInvalidArgument(
      MoeRouterBackward(logits, expert, prob, p2, Tensor(), ob, &dlogits),
      {"MoeRouterBackward", "aux_grad", "4 elements"}));
  Tensor bf16 = *Tensor::Empty(Shape{5, 4}, DType::kBF16);
  EXPECT_FALSE(MoeRouteTopK(bf16, {4, 2}, &expert, &prob, &stats).ok());
}

}  // namespace
}  // namespace loom::core::cpu
