#include "core/cpu/embedding.h"

#include <vector>

#include "core/cpu/test_tolerances.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

TEST(EmbeddingTest, ForwardCopiesRowsForI32AndI64) {
  const Tensor table = Random({10, 6}, 1);
  for (DType it : {DType::kI32, DType::kI64}) {
    const Tensor ids = Ids({2, 3}, it, {3, 0, 9, 3, 5, 1});
    Tensor out = Make({2, 3, 6});
    LOOM_ASSERT_OK(EmbeddingForward(ids, table, &out));
    const int64_t want_rows[6] = {3, 0, 9, 3, 5, 1};
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j < 6; ++j) {
        EXPECT_EQ(out.data<float>()[i * 6 + j], table.data<float>()[want_rows[i] * 6 + j]);
      }
    }
  }
}

TEST(EmbeddingTest, BackwardScatterAddsDuplicatesAndMatchesFiniteDifferences) {
  Tensor table = Random({7, 5}, 1);
  const Tensor ids = Ids({8}, DType::kI32, {1, 4, 1, 6, 0, 1, 4, 2});
  const Tensor w = Random({8, 5}, 2);
  Tensor out = Make({8, 5});
  auto loss = [&] {
    EXPECT_TRUE(EmbeddingForward(ids, table, &out).ok());
    return Dot(out, w);
  };
  Tensor dtable = Random({7, 5}, 3);  // accumulated into
  const std::vector<double> before = ToDouble(dtable);
  LOOM_ASSERT_OK(EmbeddingBackward(ids, w, &dtable));
  std::vector<double> grad = ToDouble(dtable);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] -= before[i];
  // Exact reference: row 1 gets tokens 0, 2, 5; row 3 and 5 get nothing.
  std::vector<double> want(35, 0.0);
  const int rows[8] = {1, 4, 1, 6, 0, 1, 4, 2};
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 5; ++j) want[rows[i] * 5 + j] += w.data<float>()[i * 5 + j];
  }
  for (int i = 0; i < 35; ++i) EXPECT_NEAR(grad[i], want[i], 1e-6) << i;
  const Tensor dir = Random({7, 5}, 4);
  const double fd = DirectionalDerivative(table, dir, kFdEps, loss);
  EXPECT_NEAR(Dot(grad, dir), fd, 1e-4 * std::fabs(fd) + 1e-5);
}

TEST(EmbeddingTest, VocabParallelShardZerosForeignIds) {
  // Full vocab 10 split in two shards of 5; the sum of the shards' outputs is
  // the full lookup, and each shard's grad is its rows of the full grad.
  const Tensor full = Random({10, 4}, 1);
  const Tensor ids = Ids({6}, DType::kI64, {0, 7, 4, 5, 9, 7});
  const Tensor w = Random({6, 4}, 2);
  Tensor out_full = Make({6, 4}), dfull = Make({10, 4});
  LOOM_ASSERT_OK(EmbeddingForward(ids, full, &out_full));
  LOOM_ASSERT_OK(EmbeddingBackward(ids, w, &dfull));
  std::vector<double> sum(24, 0.0);
  for (int shard = 0; shard < 2; ++shard) {
    const Tensor table = Copy(*full.Narrow(5 * shard, 5));
    const EmbeddingOptions o{5 * shard, true};
    Tensor out = Make({6, 4}), dtable = Make({5, 4});
    LOOM_ASSERT_OK(EmbeddingForward(ids, table, &out, o));
    LOOM_ASSERT_OK(EmbeddingBackward(ids, w, &dtable, o));
    for (int i = 0; i < 24; ++i) sum[i] += out.data<float>()[i];
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(dtable.data<float>()[i], dfull.data<float>()[shard * 20 + i]);
    }
  }
  for (int i = 0; i < 24; ++i) EXPECT_EQ(sum[i], out_full.data<float>()[i]);
}

TEST(EmbeddingTest, ErrorsNameOpAndShapes) {
  const Tensor table = Make({10, 6});
  Tensor out = Make({3, 6});
  EXPECT_TRUE(IsInvalidArgument(EmbeddingForward(Ids({3}, DType::kI32, {1, 10, 2}), table, &out),
                                {"EmbeddingForward", "ids[1] = 10", "[0, 10)", "f32[10, 6]"}));
  EXPECT_TRUE(IsInvalidArgument(EmbeddingForward(Ids({3}, DType::kI32, {1, -1, 2}), table, &out),
                                {"EmbeddingForward", "ids[1] = -1"}));
  EXPECT_TRUE(IsInvalidArgument(EmbeddingForward(Make({3}), table, &out),
                                {"EmbeddingForward", "ids", "f32[3]", "i32 or i64"}));
  Tensor out_bad = Make({3, 5});
  EXPECT_TRUE(IsInvalidArgument(EmbeddingForward(Ids({3}, DType::kI32, {1, 2, 3}), table, &out_bad),
                                {"EmbeddingForward", "out", "3 rows of 6"}));
  Tensor dtable = Make({10, 6});
  EXPECT_TRUE(
      IsInvalidArgument(EmbeddingBackward(Ids({3}, DType::kI64, {1, 2, 30}), Make({3, 6}), &dtable),
                        {"EmbeddingBackward", "ids[2] = 30"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
