#include "layers/params.h"

#include "gtest/gtest.h"

namespace loom::layers {
namespace {

ParamSpec Spec(const char* name, core::Shape shape, TpSplit split) {
  ParamSpec s;
  s.name = name;
  s.global_shape = shape;
  s.split = split;
  s.init = Init::kNormal;
  s.std = 1.0f;
  return s;
}

TEST(ParamBufferTest, ShardsAreSlicesOfTheSameFullTensor) {
  std::vector<ParamSpec> specs = {Spec("rows", {6, 4}, TpSplit::kRows),
                                  Spec("cols", {4, 6}, TpSplit::kCols),
                                  Spec("rep", {5}, TpSplit::kReplicated)};
  auto full = ParamBuffer::Create(specs, 0, 1, 77);
  ASSERT_TRUE(full.ok());
  for (int p : {2, 3}) {
    for (int r = 0; r < p; ++r) {
      auto shard = ParamBuffer::Create(specs, r, p, 77);
      ASSERT_TRUE(shard.ok());
      const Param& rows = shard->at("rows");
      EXPECT_EQ(rows.value.dim(0), 6 / p);
      for (int64_t i = 0; i < rows.value.numel(); ++i) {
        EXPECT_EQ(rows.value.data<float>()[i], full->at("rows").value.data<float>()[r * (24 / p) + i]);
      }
      const Param& cols = shard->at("cols");
      const int64_t w = 6 / p;
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < w; ++j)
          EXPECT_EQ(cols.value.data<float>()[i * w + j],
                    full->at("cols").value.data<float>()[i * 6 + r * w + j]);
      EXPECT_EQ(shard->at("rep").value.data<float>()[4], full->at("rep").value.data<float>()[4]);
    }
  }
}

TEST(ParamBufferTest, ViewsLiveInOneContiguousBuffer) {
  auto buf = ParamBuffer::Create({Spec("a", {2, 3}, TpSplit::kReplicated),
                                  Spec("b", {4}, TpSplit::kReplicated)},
                                 0, 1, 1);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->numel(), 10);
  EXPECT_EQ(buf->padded_numel(), 10);
  EXPECT_TRUE(buf->at("b").value.SharesStorageWith(buf->flat_values()));
  buf->at("b").grad.data<float>()[0] = 5.0f;
  EXPECT_EQ(buf->flat_grads().data<float>()[6], 5.0f);
  ASSERT_TRUE(buf->ZeroGrads().ok());
  EXPECT_EQ(buf->flat_grads().data<float>()[6], 0.0f);
}

// Without gradients (ZeRO-2's model): no buffer is allocated, every grad is
// undefined until its owner binds one, and the values are as with them.
TEST(ParamBufferTest, WithoutGradientsNoBufferUntilOneIsBound) {
  const std::vector<ParamSpec> specs = {Spec("a", {2, 3}, TpSplit::kReplicated),
                                        Spec("b", {4}, TpSplit::kReplicated)};
  auto with = ParamBuffer::Create(specs, 0, 1, 1);
  auto without = ParamBuffer::Create(specs, 0, 1, 1, 1, core::Device::CPU(), core::DType::kF32,
                                     /*gradients=*/false);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_FALSE(without->flat_grads().defined());
  EXPECT_FALSE(without->at("a").grad.defined());
  EXPECT_TRUE(without->ZeroGrads().ok());
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(without->flat_values().data<float>()[i], with->flat_values().data<float>()[i]);
  }
  auto flat = core::Tensor::Zeros(core::Shape{without->padded_numel()}, core::DType::kF32);
  ASSERT_TRUE(flat.ok());
  ASSERT_TRUE(without->BindGrads(*flat).ok());
  ASSERT_TRUE(without->at("b").grad.defined());
  EXPECT_EQ(without->at("b").grad.data<float>(), flat->data<float>() + without->at("b").offset);
}

// Without values (ZeRO-3's model): no value buffer, every value undefined
// with its shape known; InitialValues gives any flat range of what a buffer
// with values holds (padding zero, TP shards included), and BindValues
// points a range's parameters at a gathered buffer and back to nothing.
TEST(ParamBufferTest, WithoutValuesInitialValuesAndBindValues) {
  const std::vector<ParamSpec> specs = {Spec("rows", {6, 4}, TpSplit::kRows),
                                        Spec("cols", {4, 6}, TpSplit::kCols),
                                        Spec("rep", {5}, TpSplit::kReplicated)};
  for (const int r : {0, 1}) {
    auto with = ParamBuffer::Create(specs, r, 2, 9, /*multiple=*/4);
    auto without = ParamBuffer::Create(specs, r, 2, 9, 4, core::Device::CPU(), core::DType::kF32,
                                       /*gradients=*/false, /*values=*/false);
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_FALSE(without->holds_values());
    EXPECT_FALSE(without->at("cols").value.defined());
    EXPECT_EQ(without->at("cols").shape, with->at("cols").value.shape());
    EXPECT_EQ(without->padded_numel(), with->padded_numel());
    const int64_t n = without->padded_numel();
    std::vector<float> all(n);
    ASSERT_TRUE(without->InitialValues(0, n, all.data()).ok());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(all[i], with->flat_values().data<float>()[i]) << i;
    std::vector<float> part(5);  // a range cutting through a parameter
    ASSERT_TRUE(without->InitialValues(10, 15, part.data()).ok());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(part[i], all[10 + i]);
    EXPECT_FALSE(without->InitialValues(0, n + 1, all.data()).ok());

    const Param& cols = without->at("cols");
    const int64_t begin = cols.offset, end = without->SlotEnd(without->Find("cols"));
    auto gathered = core::Tensor::Zeros(core::Shape{end - begin}, core::DType::kF32);
    ASSERT_TRUE(gathered.ok());
    ASSERT_TRUE(without->BindValues(begin, end, *gathered, core::Tensor()).ok());
    EXPECT_EQ(cols.value.data<float>(), gathered->data<float>());
    EXPECT_EQ(cols.master.data<float>(), gathered->data<float>());
    EXPECT_FALSE(without->at("rows").value.defined()) << "outside the range";
    ASSERT_TRUE(without->BindValues(begin, end, core::Tensor(), core::Tensor()).ok());
    EXPECT_FALSE(cols.value.defined());
    EXPECT_EQ(with->BindValues(begin, end, *gathered, core::Tensor()).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST(ParamBufferTest, PaddingToAMultipleIsZero) {
  auto buf = ParamBuffer::Create({Spec("a", {7}, TpSplit::kReplicated)}, 0, 1, 1, /*multiple=*/4);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->numel(), 7);
  EXPECT_EQ(buf->padded_numel(), 8);
  EXPECT_EQ(buf->flat_values().data<float>()[7], 0.0f);
}

TEST(ParamBufferTest, InitIsNormalWithTheRequestedStd) {
  ParamSpec s = Spec("w", {200, 100}, TpSplit::kReplicated);
  s.std = 0.02f;
  auto buf = ParamBuffer::Create({s}, 0, 1, 5);
  ASSERT_TRUE(buf.ok());
  double sum = 0, sq = 0;
  const float* v = buf->at("w").value.data<float>();
  for (int i = 0; i < 20000; ++i) {
    sum += v[i];
    sq += double(v[i]) * v[i];
  }
  EXPECT_NEAR(sum / 20000, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sq / 20000), 0.02, 0.001);
  // Another seed, another model.
  auto other = ParamBuffer::Create({s}, 0, 1, 6);
  EXPECT_NE(other->at("w").value.data<float>()[0], v[0]);
}

TEST(ParamBufferTest, IndivisibleSplitNamesTheParameter) {
  auto buf = ParamBuffer::Create({Spec("layers.0.attention.qkv.weight", {9, 4}, TpSplit::kRows)},
                                 0, 2, 1);
  ASSERT_FALSE(buf.ok());
  EXPECT_NE(buf.status().message().find("layers.0.attention.qkv.weight"), std::string::npos);
  EXPECT_NE(buf.status().message().find("--tensor-model-parallel-size 2"), std::string::npos);
}

}  // namespace
}  // namespace loom::layers
