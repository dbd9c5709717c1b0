#include "core/cpu/flash_block.h"

#include <cmath>
#include <cstring>

#include "core/cpu/flash_attention.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu {
namespace {

using ops::FlashBlockOptions;
using testing::IsInvalidArgument;
using testing::Random;

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// The ops are loops over the block API: the ring's arithmetic, bit for bit.
// Two Q runs against two K/V runs at zig-zag positions (skipped, full and
// diagonal blocks), with dropout at a TP head offset.
TEST(FlashBlockTest, OpsAreTheBlockApiBitwise) {
  const int64_t c = 11, rows = 2 * c, b = 2, heads = 3, d = 8, s = 8 * c;
  const Tensor qkv = Random(Shape{rows, b, heads * 3 * d}, 1);
  const Tensor kv = Random(Shape{rows, b, heads * 2 * d}, 2);
  const Tensor dout = Random(Shape{rows, b, heads * d}, 3);
  AttentionDropout dr;
  dr.p = 0.2f, dr.seed = 9, dr.offset = 4, dr.head_offset = 2, dr.total_heads = 7;
  const int64_t q_starts[2] = {1 * c, 6 * c}, k_starts[2] = {3 * c, 4 * c};
  std::vector<FlashBlockOptions> blocks;
  for (int qh = 0; qh < 2; ++qh) {
    for (int kh = 0; kh < 2; ++kh) {
      FlashBlockOptions o;
      o.heads = heads, o.seq_len = s, o.dropout = dr;
      o.q_row = qh * c, o.q_len = c, o.q_start = q_starts[qh];
      o.k_row = kh * c, o.k_len = c, o.k_start = k_starts[kh];
      blocks.push_back(o);
    }
  }
  // Through the ops.
  const Shape row_s{b, heads, rows};
  Tensor acc = *Tensor::Empty(Shape{b, heads, rows, d}, DType::kF32);
  Tensor mx = *Tensor::Empty(row_s, DType::kF32), sum = *Tensor::Empty(row_s, DType::kF32);
  Tensor out = *Tensor::Empty(dout.shape(), DType::kF32), lse = *Tensor::Empty(row_s, DType::kF32);
  Tensor delta = *Tensor::Empty(row_s, DType::kF32);
  Tensor dqkv = *Tensor::Zeros(qkv.shape(), DType::kF32), dkv = *Tensor::Zeros(kv.shape(), DType::kF32);
  LOOM_ASSERT_OK(FlashBlockInit(&acc, &mx, &sum));
  for (const auto& o : blocks) LOOM_ASSERT_OK(FlashBlockForward(qkv, kv, o, &acc, &mx, &sum));
  LOOM_ASSERT_OK(FlashBlockFinish(acc, mx, sum, &out, &lse));
  LOOM_ASSERT_OK(FlashBlockDelta(dout, out, heads, &delta));
  for (const auto& o : blocks) {
    LOOM_ASSERT_OK(FlashBlockBackward(dout, qkv, kv, lse, delta, o, &dqkv, &dkv));
  }
  // The block API per pair, as the ring called it.
  const int64_t pairs = b * heads, ld_q = pairs * 3 * d, ld_kv = pairs * 2 * d, ld_o = pairs * d;
  std::vector<float> w_acc(pairs * rows * d), w_m(pairs * rows), w_l(pairs * rows);
  Tensor w_out = *Tensor::Empty(out.shape(), DType::kF32), w_lse = *Tensor::Empty(row_s, DType::kF32);
  Tensor w_delta = *Tensor::Empty(row_s, DType::kF32);
  Tensor w_dqkv = *Tensor::Zeros(qkv.shape(), DType::kF32), w_dkv = *Tensor::Zeros(kv.shape(), DType::kF32);
  for (int64_t p = 0; p < pairs; ++p) {
    auto block = [&](const FlashBlockOptions& o) {
      FlashBlock blk;
      blk.d = d;
      blk.q = qkv.data<float>() + (o.q_row * pairs + p) * 3 * d, blk.ld_q = ld_q;
      blk.q_start = o.q_start, blk.q_len = o.q_len;
      blk.k = kv.data<float>() + (o.k_row * pairs + p) * 2 * d, blk.v = blk.k + d;
      blk.ld_kv = ld_kv, blk.k_start = o.k_start, blk.k_len = o.k_len, blk.seq_len = s;
      blk.global_pair = (p / heads) * dr.total_heads + dr.head_offset + p % heads;
      blk.dropout = dr;
      return blk;
    };
    FlashRunning all{w_acc.data() + p * rows * d, d, w_m.data() + p * rows, w_l.data() + p * rows};
    FlashRunningInit(rows, d, &all);
    for (const auto& o : blocks) {
      if (o.k_start > o.q_start + o.q_len - 1) continue;
      FlashRunning st{all.acc + o.q_row * d, d, all.m + o.q_row, all.l + o.q_row};
      LOOM_ASSERT_OK(FlashForwardBlock(block(o), &st));
    }
    FlashRunningFinish(rows, d, all, w_out.data<float>() + p * d, ld_o, w_lse.data<float>() + p * rows);
    FlashDelta(rows, d, dout.data<float>() + p * d, ld_o, w_out.data<float>() + p * d, ld_o,
               w_delta.data<float>() + p * rows);
    for (const auto& o : blocks) {
      if (o.k_start > o.q_start + o.q_len - 1) continue;
      FlashGrads g;
      g.dq = w_dqkv.data<float>() + (o.q_row * pairs + p) * 3 * d, g.ld_dq = ld_q;
      g.dk = w_dkv.data<float>() + (o.k_row * pairs + p) * 2 * d, g.dv = g.dk + d;
      g.ld_dkv = ld_kv;
      LOOM_ASSERT_OK(FlashBackwardBlock(block(o), dout.data<float>() + o.q_row * ld_o + p * d,
                                        ld_o, w_lse.data<float>() + p * rows + o.q_row,
                                        w_delta.data<float>() + p * rows + o.q_row, g));
    }
  }
  EXPECT_TRUE(SameBits(out, w_out));
  EXPECT_TRUE(SameBits(lse, w_lse));
  EXPECT_TRUE(SameBits(delta, w_delta));
  EXPECT_TRUE(SameBits(dqkv, w_dqkv));
  EXPECT_TRUE(SameBits(dkv, w_dkv));
  EXPECT_EQ(std::memcmp(acc.raw_data(), w_acc.data(), acc.nbytes()), 0);
}

TEST(FlashBlockTest, KvPackAndUnpack) {
  const int64_t rows = 5, b = 2, heads = 3, d = 4;
  const Tensor qkv = Random(Shape{rows, b, heads * 3 * d}, 1);
  Tensor kv = *Tensor::Empty(Shape{rows, b, heads * 2 * d}, DType::kF32);
  LOOM_ASSERT_OK(FlashKvPack(qkv, heads, &kv));
  Tensor back = Random(qkv.shape(), 2);
  const Tensor before = *back.To(Device::CPU());
  LOOM_ASSERT_OK(FlashKvUnpack(kv, heads, &back));
  for (int64_t r = 0; r < rows * b * heads; ++r) {
    for (int64_t e = 0; e < 3 * d; ++e) {
      const float want = e < d ? before.data<float>()[r * 3 * d + e] : qkv.data<float>()[r * 3 * d + e];
      ASSERT_EQ(back.data<float>()[r * 3 * d + e], want) << r << " " << e;
    }
  }
}

TEST(FlashBlockTest, RejectsBadArguments) {
  const Tensor qkv = Random(Shape{8, 1, 2 * 3 * 4}, 1), kv = Random(Shape{6, 1, 2 * 2 * 4}, 2);
  Tensor acc = *Tensor::Empty(Shape{1, 2, 8, 4}, DType::kF32);
  Tensor mx = *Tensor::Empty(Shape{1, 2, 8}, DType::kF32), sum = *Tensor::Empty(Shape{1, 2, 8}, DType::kF32);
  FlashBlockOptions o;
  o.heads = 2, o.q_len = 8, o.k_len = 8, o.seq_len = 8;
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv, o, &acc, &mx, &sum),
                                {"FlashBlockForward", "key rows [0, 8)", "6 rows of kv"}));
  o.k_len = 6, o.q_start = 1;
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv, o, &acc, &mx, &sum),
                                {"query positions [1, 9)"}));
  o.q_start = 0;
  Tensor small = *Tensor::Empty(Shape{1, 2, 7}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv, o, &acc, &small, &sum), {"max"}));
  o.dropout.p = 1.5f;
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv, o, &acc, &mx, &sum), {"FlashBlockForward"}));
  Tensor kv8 = *Tensor::Empty(Shape{8, 1, 2 * 2 * 3}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(FlashKvPack(qkv, 2, &kv8), {"FlashKvPack", "kv"}));
}

}  // namespace
}  // namespace loom::core::cpu
