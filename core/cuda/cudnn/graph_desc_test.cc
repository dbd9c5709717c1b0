#include "core/cuda/cudnn/graph_desc.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::core::cuda::cudnn {
namespace {

int64_t At(const Strided& t, int64_t b, int64_t h, int64_t s, int64_t d) {
  return b * t.stride[0] + h * t.stride[1] + s * t.stride[2] + d * t.stride[3];
}

// Q, K, V of the interleaved desc address exactly Loom's [s, b, heads, {q, k,
// v}, d] elements, each once, and nothing else.
TEST(GraphDescTest, InterleavedStridesAddressLoomsQkvLayout) {
  const AttentionShape g{3, 5, 4, 4, 8};
  const SdpaDesc desc = InterleavedDesc(Direction::kBackward, g, DType::kBF16);
  const std::array<int64_t, 4> dims = {3, 4, 5, 8};
  EXPECT_EQ(desc.q.dim, dims);
  EXPECT_EQ(desc.q.stride, (std::array<int64_t, 4>{3 * 4 * 8, 3 * 8, 3 * 3 * 4 * 8, 1}));
  EXPECT_EQ(desc.k, desc.q);
  EXPECT_EQ(desc.v, desc.q);
  EXPECT_EQ(desc.dq, desc.q);
  EXPECT_EQ(desc.dk, desc.k);
  EXPECT_EQ(desc.dv, desc.v);
  std::set<int64_t> seen;
  const int64_t offsets[3] = {0, InterleavedKOffset(g.head_dim), InterleavedVOffset(g.head_dim)};
  const Strided* tensors[3] = {&desc.q, &desc.k, &desc.v};
  for (int which = 0; which < 3; ++which) {
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t h = 0; h < g.heads; ++h) {
        for (int64_t s = 0; s < g.seq; ++s) {
          for (int64_t d = 0; d < g.head_dim; ++d) {
            const int64_t got = offsets[which] + At(*tensors[which], b, h, s, d);
            const int64_t want = (((s * g.batch + b) * g.heads + h) * 3 + which) * g.head_dim + d;
            ASSERT_EQ(got, want) << "tensor " << which << " b" << b << " h" << h << " s" << s;
            seen.insert(got);
          }
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), g.seq * g.batch * g.heads * 3 * g.head_dim);
}

TEST(GraphDescTest, OutAndStatsStrides) {
  const AttentionShape g{2, 7, 3, 3, 16};
  const SdpaDesc desc = InterleavedDesc(Direction::kForward, g, DType::kBF16);
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t h = 0; h < g.heads; ++h) {
      for (int64_t s = 0; s < g.seq; ++s) {
        // out [s, b, heads * d]; lse [b, heads, s]
        EXPECT_EQ(At(desc.o, b, h, s, 5), ((s * g.batch + b) * g.heads + h) * g.head_dim + 5);
        EXPECT_EQ(At(desc.stats, b, h, s, 0), (b * g.heads + h) * g.seq + s);
      }
    }
  }
  EXPECT_EQ(desc.stats.dim, (std::array<int64_t, 4>{2, 3, 7, 1}));
  EXPECT_FLOAT_EQ(desc.scale, 0.25f);
  EXPECT_TRUE(desc.causal);
  EXPECT_TRUE(desc.deterministic);
}

TEST(GraphDescTest, SeparateGqaStrides) {
  const AttentionShape g{2, 6, 8, 2, 16};
  const SdpaDesc desc = SeparateDesc(Direction::kBackward, g, DType::kBF16);
  EXPECT_EQ(desc.q.dim, (std::array<int64_t, 4>{2, 8, 6, 16}));
  EXPECT_EQ(desc.k.dim, (std::array<int64_t, 4>{2, 2, 6, 16}));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t s = 0; s < g.seq; ++s) {
      EXPECT_EQ(At(desc.q, b, 7, s, 3), ((s * g.batch + b) * 8 + 7) * 16 + 3);
      EXPECT_EQ(At(desc.k, b, 1, s, 3), ((s * g.batch + b) * 2 + 1) * 16 + 3);
    }
  }
  EXPECT_EQ(desc.v, desc.k);
  EXPECT_EQ(desc.dk, desc.k);
  EXPECT_EQ(desc.dq, desc.q);
  EXPECT_EQ(desc.o, desc.q);  // MHA-width output, same [s, b, heads * d]
}

TEST(GraphDescTest, KeysDistinguishEveryGraph) {
  const AttentionShape g{2, 128, 16, 16, 64};
  const AttentionShape gqa{2, 128, 32, 8, 64};
  const AttentionShape longer{2, 256, 16, 16, 64};
  std::vector<std::string> keys = {
      InterleavedDesc(Direction::kForward, g, DType::kBF16).Key(),
      InterleavedDesc(Direction::kBackward, g, DType::kBF16).Key(),
      SeparateDesc(Direction::kForward, g, DType::kBF16).Key(),  // other strides
      SeparateDesc(Direction::kForward, gqa, DType::kBF16).Key(),
      InterleavedDesc(Direction::kForward, longer, DType::kBF16).Key(),
      InterleavedDesc(Direction::kForward, g, DType::kF16).Key(),
  };
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size());
  EXPECT_EQ(keys[0], InterleavedDesc(Direction::kForward, g, DType::kBF16).Key());
}

TEST(GraphDescTest, SupportsBf16WithoutDropout) {
  for (int64_t d : {8, 64, 128}) {
    EXPECT_TRUE(Supports({2, 128, 16, 16, d}, DType::kBF16, 0.0f).ok()) << d;
    EXPECT_TRUE(Supports({2, 128, 32, 8, d}, DType::kBF16, 0.0f).ok()) << d;
  }
}

TEST(GraphDescTest, RefusesWhatCudnnCannotDoAsUnimplemented) {
  const AttentionShape g{2, 128, 16, 16, 64};
  absl::Status st = Supports(g, DType::kF32, 0.0f);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("f32"), std::string::npos) << st;
  EXPECT_NE(st.message().find("bf16"), std::string::npos) << st;

  st = Supports(g, DType::kBF16, 0.1f);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("dropout"), std::string::npos) << st;
  EXPECT_NE(st.message().find("Philox"), std::string::npos) << st;

  for (int64_t d : {12, 136, 256, 512}) {
    st = Supports({2, 128, 16, 16, d}, DType::kBF16, 0.0f);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << d;
    EXPECT_NE(st.message().find("head dim"), std::string::npos) << st;
  }
}

TEST(GraphDescTest, MalformedSizesAreInvalidArgument) {
  EXPECT_EQ(Supports({2, 128, 16, 6, 64}, DType::kBF16, 0.0f).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Supports({0, 128, 16, 16, 64}, DType::kBF16, 0.0f).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Supports({2, 128, 16, 0, 64}, DType::kBF16, 0.0f).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::core::cuda::cudnn
