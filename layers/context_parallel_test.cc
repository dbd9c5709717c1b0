#include "layers/context_parallel.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "comm/testing/ranks_as_threads.h"
#include "core/cpu/flash_attention.h"
#include "gtest/gtest.h"

namespace loom::layers {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

Tensor Random(const Shape& shape, uint32_t seed) {
  Tensor t = *Tensor::Empty(shape, DType::kF32);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

// Largest |a - b| / (1 + |b|).
double MaxError(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    if (std::isinf(y) && x == y) continue;  // a row that sees no key
    worst = std::max(worst, std::abs(x - y) / (1.0 + std::abs(y)));
  }
  return worst;
}

// lse [b, heads, s] -> this rank's columns [b, heads, 2c].
Tensor LocalLse(const Tensor& lse, const ContextParallelLayout& l) {
  const int64_t pairs = lse.dim(0) * lse.dim(1);
  Tensor out = *Tensor::Empty(Shape{lse.dim(0), lse.dim(1), l.local_len()}, DType::kF32);
  const std::vector<int64_t> pos = LocalPositions(l);
  for (int64_t p = 0; p < pairs; ++p) {
    for (size_t i = 0; i < pos.size(); ++i) {
      out.data<float>()[p * l.local_len() + i] = lse.data<float>()[p * l.seq_len + pos[i]];
    }
  }
  return out;
}

struct Case {
  int cp;
  float dropout;
  bool packed = false;  // documents packed in the rows (AttentionDropout::doc_start)
};

// Document starts of rows [0, 2) of a 48-token sequence, [2, 48] flattened:
// documents that end inside a CP chunk, cross chunks and ranks, and one of a
// single token.
std::vector<int32_t> PackedDocStarts(int64_t s) {
  const std::vector<std::vector<int32_t>> starts = {{0, 7, 20, 21, 40}, {0, 30}};
  std::vector<int32_t> doc_start;
  for (const std::vector<int32_t>& row : starts) {
    for (int64_t i = 0, k = 0; i < s; ++i) {
      if (k + 1 < static_cast<int64_t>(row.size()) && i == row[k + 1]) ++k;
      doc_start.push_back(row[k]);
    }
  }
  return doc_start;
}

class RingAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(RingAttentionTest, EqualsTheWholeSequenceKernel) {
  const int cp = GetParam().cp;
  const int64_t s = 48, b = 2, heads = 3, d = 8;
  core::cpu::AttentionDropout dropout;
  dropout.p = GetParam().dropout;
  dropout.seed = 1234;
  dropout.offset = 5;
  dropout.head_offset = 1;  // a TP rank holding heads 1..3 of 5
  dropout.total_heads = 5;
  const std::vector<int32_t> doc_start = PackedDocStarts(s);
  if (GetParam().packed) dropout.doc_start = doc_start.data();
  const Tensor qkv = Random(Shape{s, b, heads * 3 * d}, 1);
  const Tensor dout = Random(Shape{s, b, heads * d}, 2);
  Tensor out = *Tensor::Empty(Shape{s, b, heads * d}, DType::kF32);
  Tensor lse = *Tensor::Empty(Shape{b, heads, s}, DType::kF32);
  Tensor dqkv = *Tensor::Empty(qkv.shape(), DType::kF32);
  ASSERT_TRUE(core::cpu::FlashAttentionForward(qkv, heads, &out, &lse, dropout).ok());
  ASSERT_TRUE(
      core::cpu::FlashAttentionBackward(dout, qkv, out, lse, heads, &dqkv, dropout).ok());

  std::vector<double> err_out(cp), err_lse(cp), err_dqkv(cp);
  absl::Status st = comm::testing::RunRanksAsThreads(
      cp, [&](int r, comm::Communicator* c) -> absl::Status {
        const ContextParallelLayout l{s, cp, r};
        auto q = SelectLocalRows(qkv, l);
        auto dq_in = SelectLocalRows(dout, l);
        if (!q.ok()) return q.status();
        if (!dq_in.ok()) return dq_in.status();
        Tensor o = *Tensor::Empty(Shape{l.local_len(), b, heads * d}, DType::kF32);
        Tensor ls = *Tensor::Empty(Shape{b, heads, l.local_len()}, DType::kF32);
        Tensor g = *Tensor::Empty(q->shape(), DType::kF32);
        absl::Status f = RingAttentionForward(*c, l, *q, heads, dropout, &o, &ls);
        if (!f.ok()) return f;
        f = RingAttentionBackward(*c, l, *dq_in, *q, o, ls, heads, dropout, &g);
        if (!f.ok()) return f;
        err_out[r] = MaxError(o, *SelectLocalRows(out, l));
        err_lse[r] = MaxError(ls, LocalLse(lse, l));
        err_dqkv[r] = MaxError(g, *SelectLocalRows(dqkv, l));
        return absl::OkStatus();
      });
  ASSERT_TRUE(st.ok()) << st;
  for (int r = 0; r < cp; ++r) {
    // The ring merges the same blocks in another order: f32 rounding only.
    EXPECT_LT(err_out[r], 2e-5) << "rank " << r;
    EXPECT_LT(err_lse[r], 2e-5) << "rank " << r;
    EXPECT_LT(err_dqkv[r], 5e-5) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(CpAndDropout, RingAttentionTest,
                         ::testing::Values(Case{1, 0.0f}, Case{2, 0.0f}, Case{4, 0.0f},
                                           Case{2, 0.2f}, Case{4, 0.2f}, Case{3, 0.1f},
                                           Case{2, 0.0f, true}, Case{4, 0.0f, true},
                                           Case{4, 0.2f, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "cp" + std::to_string(i.param.cp) +
                                  (i.param.dropout > 0 ? "_dropout" : "") +
                                  (i.param.packed ? "_packed" : "");
                         });

TEST(ContextParallelLayout, ZigZagChunks) {
  const ContextParallelLayout l{16, 2, 1};  // 4 chunks of 4: rank 1 holds chunks 1 and 2
  EXPECT_EQ(LocalPositions(l),
            (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  const ContextParallelLayout l0{16, 2, 0};  // rank 0: chunks 0 and 3
  EXPECT_EQ(LocalPositions(l0),
            (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  absl::Status bad = CheckContextParallelLayout({30, 4, 0});
  EXPECT_NE(bad.message().find("--seq-length (30) must be a multiple of 2 x "
                               "--context-parallel-size (8)"),
            std::string::npos)
      << bad;
}

}  // namespace
}  // namespace loom::layers
