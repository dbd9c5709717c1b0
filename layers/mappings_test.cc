// The six conjugate operators, forward and backward, on 2, 3 and 4 ranks;
// expected values computed from (rank, index).
#include "layers/mappings.h"

#include "gtest/gtest.h"
#include "layers/test_util.h"

namespace loom::layers {
namespace {

using core::Shape;
using core::Tensor;

// Rank r's tensor [rows, b, h] with value 1000·r + flat index.
Tensor RankTensor(int r, int64_t rows, int64_t b, int64_t h) {
  Tensor t = *Tensor::Empty(Shape{rows, b, h}, core::DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 1000.0f * r + i;
  return t;
}

class MappingsTest : public ::testing::TestWithParam<int> {};

TEST_P(MappingsTest, SequenceGatherAndReduceScatterAreConjugate) {
  const int p = GetParam();
  absl::Status s = testing::RunRanks(p, [&](int r, comm::Communicator* c) -> absl::Status {
    TpGroup tp{c, true};
    Tensor x = RankTensor(r, 2, 3, 4);  // [s/p = 2, b, h]
    auto full = GatherSequence::Forward(tp, x);
    if (!full.ok()) return full.status();
    EXPECT_EQ(full->shape(), (Shape{2 * p, 3, 4}));
    for (int q = 0; q < p; ++q)
      for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(full->data<float>()[q * 24 + i], 1000.0f * q + i);
    // Backward of the gather = reduce-scatter: every rank contributes its
    // full-size gradient; rank r gets the sum of block r.
    Tensor dy = RankTensor(r, 2 * p, 3, 4);
    auto dx = GatherSequence::Backward(tp, dy);
    if (!dx.ok()) return dx.status();
    EXPECT_EQ(dx->shape(), (Shape{2, 3, 4}));
    for (int64_t i = 0; i < 24; ++i) {
      float want = 0;
      for (int q = 0; q < p; ++q) want += 1000.0f * q + r * 24 + i;
      EXPECT_EQ(dx->data<float>()[i], want);
    }
    // ReduceScatterSequence: the same pair, the other way round.
    auto rs = ReduceScatterSequence::Forward(tp, dy);
    if (!rs.ok()) return rs.status();
    EXPECT_EQ(testing::ToVector(*rs), testing::ToVector(*dx));
    auto ag = ReduceScatterSequence::Backward(tp, x);
    if (!ag.ok()) return ag.status();
    EXPECT_EQ(testing::ToVector(*ag), testing::ToVector(*full));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST_P(MappingsTest, CopyAndReduceAreConjugate) {
  const int p = GetParam();
  absl::Status s = testing::RunRanks(p, [&](int r, comm::Communicator* c) -> absl::Status {
    TpGroup tp{c, false};
    Tensor x = RankTensor(r, 1, 2, 3);
    auto copy = CopyToTp::Forward(tp, x);  // identity
    EXPECT_TRUE(copy->SharesStorageWith(x));
    auto reduced = ReduceFromTp::Forward(tp, x);  // all-reduce
    if (!reduced.ok()) return reduced.status();
    auto dcopy = CopyToTp::Backward(tp, x);  // all-reduce
    if (!dcopy.ok()) return dcopy.status();
    for (int64_t i = 0; i < 6; ++i) {
      const float want = 1000.0f * p * (p - 1) / 2 + p * i;
      EXPECT_EQ(reduced->data<float>()[i], want);
      EXPECT_EQ(dcopy->data<float>()[i], want);
      EXPECT_EQ(x.data<float>()[i], 1000.0f * r + i);  // input untouched
    }
    EXPECT_TRUE(ReduceFromTp::Backward(tp, x)->SharesStorageWith(x));  // identity
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST_P(MappingsTest, LastDimSplitAndGatherAreConjugate) {
  const int p = GetParam();
  absl::Status s = testing::RunRanks(p, [&](int r, comm::Communicator* c) -> absl::Status {
    TpGroup tp{c, false};
    // The same full tensor on every rank: [2, 3, 2p] with value = flat index.
    Tensor full = RankTensor(0, 2, 3, 2 * p);
    auto part = SplitLast::Forward(tp, full);
    if (!part.ok()) return part.status();
    EXPECT_EQ(part->shape(), (Shape{2, 3, 2}));
    for (int64_t row = 0; row < 6; ++row)
      for (int k = 0; k < 2; ++k)
        EXPECT_EQ(part->data<float>()[row * 2 + k], row * 2 * p + r * 2 + k);
    auto back = SplitLast::Backward(tp, *part);  // gather restores the full tensor
    if (!back.ok()) return back.status();
    EXPECT_EQ(testing::ToVector(*back), testing::ToVector(full));
    auto again = GatherLast::Backward(tp, *back);
    if (!again.ok()) return again.status();
    EXPECT_EQ(testing::ToVector(*again), testing::ToVector(*part));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(MappingsErrorTest, IndivisibleSequenceIsAnError) {
  absl::Status s = testing::RunRanks(2, [&](int r, comm::Communicator* c) -> absl::Status {
    TpGroup tp{c, true};
    auto rs = ReduceScatterSeq(tp, RankTensor(r, 3, 1, 2));
    EXPECT_FALSE(rs.ok());
    EXPECT_NE(rs.status().message().find("not divisible by the TP size 2"), std::string::npos);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(TpSizes, MappingsTest, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace loom::layers
