#include "core/cpu/dropout.h"

#include <cmath>
#include <vector>

#include "core/cpu/philox.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

// Random123's tests/kat_vectors, the "philox4x32 10" lines: counter, key, result.
TEST(PhiloxTest, KnownAnswerVectors) {
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      Philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      Philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(PhiloxTest, DropoutBitsUseDocumentedLayout) {
  // Group 0 with seed 0, offset 0: element r reads block r % 16; block 0 is the
  // all-zero known-answer vector {6627e8d5, e169c58d, bc57ac4c, 9b00dbd8}.
  const uint32_t want[8] = {0xe8d5, 0xc58d, 0xac4c, 0xdbd8, 0x6627, 0xe169, 0xbc57, 0x9b00};
  for (int k = 0; k < 8; ++k) EXPECT_EQ(DropoutBitsAt(0, 0, 16 * k), want[k]) << k;
  // counter = {lo(block), hi(block), lo(offset), hi(offset)}, key = {lo(seed), hi(seed)}.
  const uint64_t seed = 0x299f31d0a4093822ull, offset = 0x0370734413198a2eull;
  const uint64_t block = 0x05a308d3243f6a88ull, group = block / 16, lane = block % 16;
  const PhiloxCounter words =
      Philox4x32_10({0x243f6a88, 0x05a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0});
  for (uint64_t w = 0; w < 4; ++w) {
    EXPECT_EQ(DropoutBitsAt(seed, offset, 128 * group + 16 * w + lane), words[w] & 0xffff);
    EXPECT_EQ(DropoutBitsAt(seed, offset, 128 * group + 64 + 16 * w + lane), words[w] >> 16);
  }
  EXPECT_EQ(DropoutThreshold(0.0f), 0u);
  EXPECT_EQ(DropoutThreshold(0.5f), 32768u);
  EXPECT_EQ(DropoutThreshold(0.1f), 6554u);  // ceil(6553.6)
  EXPECT_EQ(DropoutThreshold(1.0f), 65536u);
}

// Expected output of one element from the scalar definition.
float Expected(float x, const DropoutOptions& o, uint64_t global_index) {
  const bool keep = DropoutBitsAt(o.seed, o.offset, global_index) >= DropoutThreshold(o.p);
  return keep ? x * (1.0f / (1.0f - o.p)) : 0.0f;
}

TEST(DropoutTest, ForwardMatchesScalarDefinitionAndRate) {
  const int64_t rows = 64, cols = 1030;  // not a multiple of 4 or of the tile
  const Tensor x = Random({rows, cols}, 1);
  Tensor out = Make({rows, cols}), mask = Make({rows, cols}, DType::kU8);
  const DropoutOptions o{0.3f, 1234, 77};
  LOOM_ASSERT_OK(DropoutForward(x, &out, o, {}, &mask));
  int64_t kept = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(out.data<float>()[i], Expected(x.data<float>()[i], o, i)) << i;
    ASSERT_EQ(mask.data<uint8_t>()[i], out.data<float>()[i] != 0.0f ? 1 : 0);
    kept += mask.data<uint8_t>()[i];
  }
  const double rate = 1.0 - static_cast<double>(kept) / x.numel();
  EXPECT_NEAR(rate, 0.3, 0.01);  // 66k draws: sd ~0.002
}

TEST(DropoutTest, SlicesDrawTheMaskOfTheFullTensor) {
  const int64_t rows = 12, cols = 40;
  const Tensor x = Random({rows, cols}, 1);
  Tensor full = Make({rows, cols});
  const DropoutOptions o{0.5f, 42, 3};
  LOOM_ASSERT_OK(DropoutForward(x, &full, o));
  // Sequence-parallel: rows [5, 9).
  {
    const Tensor xs = Copy(*x.Narrow(5, 4));
    Tensor ys = Make({4, cols});
    LOOM_ASSERT_OK(DropoutForward(xs, &ys, o, {5 * cols, cols}));
    for (int64_t i = 0; i < 4 * cols; ++i) {
      ASSERT_EQ(ys.data<float>()[i], full.data<float>()[5 * cols + i]);
    }
  }
  // Tensor-parallel: columns [13, 30) of every row (odd offset and width).
  {
    const int64_t c0 = 13, w = 17;
    Tensor xs = Make({rows, w});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < w; ++c) {
        xs.data<float>()[r * w + c] = x.data<float>()[r * cols + c0 + c];
      }
    }
    Tensor ys = Make({rows, w});
    LOOM_ASSERT_OK(DropoutForward(xs, &ys, o, {c0, cols}));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < w; ++c) {
        ASSERT_EQ(ys.data<float>()[r * w + c], full.data<float>()[r * cols + c0 + c]);
      }
    }
  }
}

TEST(DropoutTest, BackwardUsesTheSameMaskAndIsTheJacobian) {
  const Tensor x = Random({9, 31}, 1), dout = Random({9, 31}, 2);
  Tensor out = Make({9, 31}), dx = Make({9, 31});
  const DropoutOptions o{0.2f, 7, 9};
  const GlobalIndex where{100, 50};
  LOOM_ASSERT_OK(DropoutForward(x, &out, o, where));
  LOOM_ASSERT_OK(DropoutBackward(dout, &dx, o, where));
  // The op is linear: dx = out(dout) exactly.
  Tensor expect = Make({9, 31});
  LOOM_ASSERT_OK(DropoutForward(dout, &expect, o, where));
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(dx.data<float>()[i], expect.data<float>()[i]);
    ASSERT_EQ(out.data<float>()[i] == 0.0f, dx.data<float>()[i] == 0.0f);
  }
}

TEST(DropoutTest, EdgeProbabilities) {
  const Tensor x = Random({3, 5}, 1);
  Tensor out = Make({3, 5});
  LOOM_ASSERT_OK(DropoutForward(x, &out, {0.0f, 1, 0}));
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(out.data<float>()[i], x.data<float>()[i]);
  LOOM_ASSERT_OK(DropoutForward(x, &out, {1.0f, 1, 0}));
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(out.data<float>()[i], 0.0f);
}

TEST(DropoutTest, ErrorsNameOpAndShapes) {
  Tensor out = Make({3, 4});
  EXPECT_TRUE(IsInvalidArgument(DropoutForward(Make({3, 4}), &out, {1.5f, 0, 0}),
                                {"DropoutForward", "p = 1.5"}));
  EXPECT_TRUE(IsInvalidArgument(DropoutForward(Make({3, 4}), &out, {0.1f, 0, 0}, {0, 2}),
                                {"DropoutForward", "row_stride = 2"}));
  Tensor bad_mask = Make({3, 4});
  EXPECT_TRUE(IsInvalidArgument(DropoutForward(Make({3, 4}), &out, {}, {}, &bad_mask),
                                {"DropoutForward", "mask", "expected dtype u8"}));
  Tensor dx = Make({4, 3});
  EXPECT_TRUE(IsInvalidArgument(DropoutBackward(Make({3, 4}), &dx, {}),
                                {"DropoutBackward", "[3, 4]", "[4, 3]"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
