#include "core/cuda/flash_block.h"

#include <cmath>
#include <cstring>

#include "core/cpu/flash_block.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

using ops::FlashBlockOptions;

// A context-parallel-like call: `rows` local rows of Q in two runs, K/V
// blocks of ragged lengths at global positions, causal (diagonal, full,
// skipped) and non-causal blocks, with and without dropout.
struct BlockCase {
  int64_t rows, kv_rows, b, heads, d, seq_len;
  float p;
  std::vector<FlashBlockOptions> blocks;  // heads, seq_len, dropout filled in
};

std::vector<BlockCase> Cases() {
  std::vector<BlockCase> cases;
  // Ragged: 37 Q rows (runs of 20 and 17), K/V of 45 rows (runs of 29 and 16).
  BlockCase c{37, 45, 2, 3, 16, 200, 0.0f, {}};
  auto blk = [](int64_t qr, int64_t ql, int64_t qs, int64_t kr, int64_t kl, int64_t ks,
                bool causal) {
    FlashBlockOptions o;
    o.q_row = qr, o.q_len = ql, o.q_start = qs;
    o.k_row = kr, o.k_len = kl, o.k_start = ks;
    o.causal = causal;
    return o;
  };
  c.blocks = {blk(0, 20, 30, 0, 29, 10, true),     // diagonal-ish: partly masked
              blk(0, 20, 30, 29, 16, 100, true),   // every key after every query: skipped
              blk(20, 17, 150, 0, 29, 10, true),   // full (no mask)
              blk(20, 17, 150, 29, 16, 140, true), // diagonal
              blk(0, 20, 30, 29, 16, 100, false)}; // non-causal
  cases.push_back(c);
  c.p = 0.2f;
  cases.push_back(c);
  // Head dim 80 (32-row tiles), a chunk longer than a tile.
  BlockCase w{130, 130, 1, 2, 80, 400, 0.1f, {}};
  w.blocks = {blk(0, 65, 0, 0, 65, 0, true), blk(65, 65, 335, 0, 65, 0, true),
              blk(65, 65, 335, 65, 65, 335, true)};
  cases.push_back(w);
  return cases;
}

void Fill(const BlockCase& c, FlashBlockOptions* o) {
  o->heads = c.heads;
  o->seq_len = c.seq_len;
  o->dropout.p = c.p;
  o->dropout.seed = 77;
  o->dropout.offset = 3;
  o->dropout.head_offset = 1;
  o->dropout.total_heads = c.heads + 2;
}

TEST(CudaFlashBlockTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  for (const BlockCase& c : Cases()) {
    for (DType dt : FloatTypes()) {
      const Shape qkv_s{c.rows, c.b, c.heads * 3 * c.d}, kv_s{c.kv_rows, c.b, c.heads * 2 * c.d};
      const Shape out_s{c.rows, c.b, c.heads * c.d}, row_s{c.b, c.heads, c.rows};
      const Shape acc_s{c.b, c.heads, c.rows, c.d};
      const Tensor qkv = RoundedTo(Random(qkv_s, 1), dt), kv = RoundedTo(Random(kv_s, 2), dt);
      const Tensor dout = RoundedTo(Random(out_s, 3), dt);
      // CPU oracle.
      Tensor acc = CpuEmpty(acc_s, DType::kF32), mx = CpuEmpty(row_s, DType::kF32);
      Tensor sum = CpuEmpty(row_s, DType::kF32), out = CpuEmpty(out_s, DType::kF32);
      Tensor lse = CpuEmpty(row_s, DType::kF32), delta = CpuEmpty(row_s, DType::kF32);
      Tensor dqkv = *Tensor::Zeros(qkv_s, DType::kF32), dkv = *Tensor::Zeros(kv_s, DType::kF32);
      LOOM_ASSERT_OK(cpu::FlashBlockInit(&acc, &mx, &sum));
      for (FlashBlockOptions o : c.blocks) {
        Fill(c, &o);
        LOOM_ASSERT_OK(cpu::FlashBlockForward(qkv, kv, o, &acc, &mx, &sum));
      }
      LOOM_ASSERT_OK(cpu::FlashBlockFinish(acc, mx, sum, &out, &lse));
      const Tensor out_r = RoundedTo(out, dt);  // what the GPU's out holds (bf16)
      LOOM_ASSERT_OK(cpu::FlashBlockDelta(dout, out_r, c.heads, &delta));
      for (FlashBlockOptions o : c.blocks) {
        Fill(c, &o);
        LOOM_ASSERT_OK(cpu::FlashBlockBackward(dout, qkv, kv, lse, delta, o, &dqkv, &dkv));
      }
      // GPU, outputs poisoned (the accumulators zeroed as the ring does).
      Tensor g_qkv = ToGpu(qkv, dt), g_kv = ToGpu(kv, dt), g_dout = ToGpu(dout, dt);
      Tensor g_acc = Poisoned(acc_s, DType::kF32), g_mx = Poisoned(row_s, DType::kF32);
      Tensor g_sum = Poisoned(row_s, DType::kF32), g_out = Poisoned(out_s, dt);
      Tensor g_lse = Poisoned(row_s, DType::kF32), g_delta = Poisoned(row_s, DType::kF32);
      Tensor g_dqkv = ToGpu(*Tensor::Zeros(qkv_s, DType::kF32), DType::kF32);
      Tensor g_dkv = ToGpu(*Tensor::Zeros(kv_s, DType::kF32), DType::kF32);
      LOOM_ASSERT_OK(FlashBlockInit(&g_acc, &g_mx, &g_sum));
      for (FlashBlockOptions o : c.blocks) {
        Fill(c, &o);
        LOOM_ASSERT_OK(FlashBlockForward(g_qkv, g_kv, o, &g_acc, &g_mx, &g_sum));
      }
      LOOM_ASSERT_OK(FlashBlockFinish(g_acc, g_mx, g_sum, &g_out, &g_lse));
      LOOM_ASSERT_OK(FlashBlockDelta(g_dout, g_out, c.heads, &g_delta));
      for (FlashBlockOptions o : c.blocks) {
        Fill(c, &o);
        LOOM_ASSERT_OK(FlashBlockBackward(g_dout, g_qkv, g_kv, g_lse, g_delta, o, &g_dqkv, &g_dkv));
      }
      const std::string what = std::string(DTypeName(dt)) + " d=" + std::to_string(c.d) +
                               " p=" + std::to_string(c.p);
      EXPECT_LE(RelError(ToCpuF32(g_out), out), Tol(dt)) << what;
      EXPECT_LE(RelError(ToCpuF32(g_lse), lse), Tol(dt, 1e-5, 1e-3)) << what;
      // The gradients follow from the same (rounded) inputs; f32 sums in another order.
      EXPECT_LE(RelError(ToCpuF32(g_dqkv), dqkv), Tol(dt, 5e-5, 3e-2)) << what;
      EXPECT_LE(RelError(ToCpuF32(g_dkv), dkv), Tol(dt, 5e-5, 3e-2)) << what;
    }
  }
}

TEST(CudaFlashBlockTest, KvPackAndUnpackMatchCpu) {
  LOOM_REQUIRE_GPU();
  for (DType dt : FloatTypes()) {
    const int64_t rows = 13, b = 3, heads = 2, d = 24;
    const Tensor qkv = RoundedTo(Random(Shape{rows, b, heads * 3 * d}, 5), dt);
    Tensor kv = CpuEmpty(Shape{rows, b, heads * 2 * d}, DType::kF32);
    LOOM_ASSERT_OK(cpu::FlashKvPack(qkv, heads, &kv));
    Tensor g_kv = Poisoned(kv.shape(), dt);
    LOOM_ASSERT_OK(FlashKvPack(ToGpu(qkv, dt), heads, &g_kv));
    EXPECT_EQ(RelError(ToCpuF32(g_kv), kv), 0.0) << DTypeName(dt);
    // Unpack writes the k, v slots only: the q slots keep their values.
    Tensor back = qkv;
    Tensor fresh = RoundedTo(Random(kv.shape(), 6), dt);
    back = *qkv.To(Device::CPU());
    LOOM_ASSERT_OK(cpu::FlashKvUnpack(fresh, heads, &back));
    Tensor g_back = ToGpu(qkv, dt);
    LOOM_ASSERT_OK(FlashKvUnpack(ToGpu(fresh, dt), heads, &g_back));
    EXPECT_EQ(RelError(ToCpuF32(g_back), back), 0.0) << DTypeName(dt);
  }
}

// Argument errors, before any CUDA call (run everywhere).
TEST(CudaFlashBlockTest, RejectsBadArguments) {
  const Tensor qkv = Random(Shape{8, 1, 2 * 3 * 4}, 1), kv = Random(Shape{8, 1, 2 * 2 * 4}, 2);
  Tensor acc = Random(Shape{1, 2, 8, 4}, 3), mx = Random(Shape{1, 2, 8}, 4);
  Tensor sum = Random(Shape{1, 2, 8}, 5);
  FlashBlockOptions o;
  o.heads = 2, o.q_len = 8, o.k_len = 8, o.seq_len = 8;
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv, o, &acc, &mx, &sum),
                                {"FlashBlockForward", "cpu"}));
  o.q_row = 4;
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv, o, &acc, &mx, &sum),
                                {"FlashBlockForward", "query rows [4, 12)"}));
  o.q_row = 0, o.k_start = 2;
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv, o, &acc, &mx, &sum),
                                {"key positions [2, 10)", "seq_len"}));
  const Tensor kv_bad = Random(Shape{8, 1, 2 * 3 * 4}, 2);
  o.k_start = 0;
  EXPECT_TRUE(IsInvalidArgument(FlashBlockForward(qkv, kv_bad, o, &acc, &mx, &sum), {"kv"}));
  Tensor lse16 = CpuEmpty(Shape{1, 2, 8}, DType::kBF16), out = Random(Shape{8, 1, 8}, 6);
  EXPECT_TRUE(IsInvalidArgument(FlashBlockFinish(acc, mx, sum, &out, &lse16), {"lse", "bf16"}));
  Tensor small = Random(Shape{8, 1, 2 * 2 * 3}, 7);
  EXPECT_TRUE(IsInvalidArgument(FlashKvPack(qkv, 2, &small), {"FlashKvPack", "kv"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
