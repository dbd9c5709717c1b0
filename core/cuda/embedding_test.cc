#include "core/cuda/embedding.h"

#include <cmath>

#include "core/cpu/embedding.h"
#include "core/cuda/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cuda::testing {
namespace {

TEST(CudaEmbeddingTest, ForwardAndBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : FloatTypes()) {
    for (DType it : {DType::kI32, DType::kI64}) {
      for (bool shard : {false, true}) {
        const int64_t v = 50, c = 67, n = 301;
        cpu::EmbeddingOptions o;
        if (shard) {
          o.vocab_start = 40;  // rows [40, 90) of the vocabulary; other ids give zeros
          o.zero_out_of_range = true;
        }
        std::vector<int64_t> ids(n);
        for (int64_t i = 0; i < n; ++i) ids[i] = shard ? (i * 31) % 120 : (i * 31) % 7;  // duplicates
        const Tensor tids = Ids(Shape{n}, it, ids);
        const Tensor table = RoundedTo(Random(Shape{v, c}, ++seed), dt);
        Tensor want = CpuEmpty(Shape{n, c}, DType::kF32);
        LOOM_ASSERT_OK(cpu::EmbeddingForward(tids, table, &want, o));
        const Tensor gids = Upload(tids);
        Tensor out = Poisoned(Shape{n, c}, dt);
        LOOM_ASSERT_OK(cuda::EmbeddingForward(gids, ToGpu(table, dt), &out, o));
        EXPECT_EQ(RelError(ToCpuF32(out), want), 0.0);  // a copy: exact

        const Tensor dout = RoundedTo(Random(Shape{n, c}, ++seed), dt);
        const Tensor dt0 = Random(Shape{v, c}, ++seed);
        Tensor wdt = RoundedTo(dt0, DType::kF32);
        LOOM_ASSERT_OK(cpu::EmbeddingBackward(tids, dout, &wdt, o));
        Tensor gdt = ToGpu(dt0, DType::kF32);
        LOOM_ASSERT_OK(cuda::EmbeddingBackward(gids, ToGpu(dout, dt), &gdt, o));
        // ~40 duplicates per row summed by atomics in varying order: 1e-5.
        EXPECT_LE(RelError(ToCpuF32(gdt), wdt), 1e-5);
      }
    }
  }
}

TEST(CudaEmbeddingTest, OutOfRangeIdWithoutShardingGivesNanRow) {
  LOOM_REQUIRE_GPU();
  const Tensor ids = Upload(Ids(Shape{2}, DType::kI64, {1, 5}));
  const Tensor table = ToGpu(Random(Shape{3, 4}, 1), DType::kF32);
  Tensor out = Poisoned(Shape{2, 4}, DType::kF32);
  LOOM_ASSERT_OK(cuda::EmbeddingForward(ids, table, &out));
  Tensor h = ToCpuF32(out);
  for (int j = 0; j < 4; ++j) {
    EXPECT_FALSE(std::isnan(h.data<float>()[j]));
    EXPECT_TRUE(std::isnan(h.data<float>()[4 + j]));
  }
}

TEST(CudaEmbeddingTest, RejectsBadArguments) {
  Tensor ids = Ids(Shape{3}, DType::kI64, {0, 1, 2});
  Tensor table = Random(Shape{5, 4}, 1), out = CpuEmpty(Shape{3, 4}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::EmbeddingForward(ids, table, &out), {"EmbeddingForward", "cpu"}));
  Tensor bad_out = CpuEmpty(Shape{3, 5}, DType::kF32);
  EXPECT_TRUE(IsInvalidArgument(cuda::EmbeddingForward(ids, table, &bad_out), {"out", "3 rows of 4"}));
  Tensor dtable16 = CpuEmpty(Shape{5, 4}, DType::kBF16);
  EXPECT_TRUE(IsInvalidArgument(cuda::EmbeddingBackward(ids, out, &dtable16), {"dtable", "bf16", "f32"}));
  Tensor fids = Random(Shape{3}, 2);
  EXPECT_TRUE(IsInvalidArgument(cuda::EmbeddingForward(fids, table, &out), {"ids", "i32 or i64"}));
}

}  // namespace
}  // namespace loom::core::cuda::testing
