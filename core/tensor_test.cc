#include "core/tensor.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace loom::core {
namespace {

TEST(ShapeTest, NumelAndToString) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.ToString(), "[2, 3, 4]");
  EXPECT_EQ(Shape().numel(), 1);
}

TEST(ShapeTest, MakeRejectsBadRankAndNegativeDims) {
  int64_t dims[5] = {1, 2, 3, 4, 5};
  EXPECT_FALSE(Shape::Make(dims, 5).ok());
  int64_t neg[2] = {2, -1};
  absl::StatusOr<Shape> s = Shape::Make(neg, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("-1"), std::string::npos);
}

TEST(TensorTest, StorageIs64ByteAligned) {
  for (int n : {1, 3, 17, 1000}) {
    absl::StatusOr<Tensor> t = Tensor::Empty(Shape{n}, DType::kU8);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw_data()) % kStorageAlignment, 0u);
  }
}

TEST(TensorTest, DTypeSizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  absl::StatusOr<Tensor> t = Tensor::Zeros(Shape{3, 5}, DType::kI64);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->nbytes(), 120u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t->data<int64_t>()[i], 0);
}

TEST(TensorTest, NarrowSharesStorageAndWritesThrough) {
  Tensor t = *Tensor::Zeros(Shape{4, 3}, DType::kF32);
  absl::StatusOr<Tensor> rows = t.Narrow(1, 2);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->shape(), (Shape{2, 3}));
  EXPECT_TRUE(rows->SharesStorageWith(t));
  rows->data<float>()[0] = 7.0f;  // element (1, 0) of t
  EXPECT_EQ(t.data<float>()[3], 7.0f);
}

TEST(TensorTest, NarrowOutOfRangeIsAnError) {
  Tensor t = *Tensor::Zeros(Shape{4, 3}, DType::kF32);
  absl::StatusOr<Tensor> bad = t.Narrow(3, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("f32[4, 3]"), std::string::npos);
  EXPECT_FALSE(Tensor::Zeros(Shape(), DType::kF32)->Narrow(0, 1).ok());
}

TEST(TensorTest, ReshapeKeepsElementsAndChecksCount) {
  Tensor t = *Tensor::Zeros(Shape{2, 6}, DType::kI32);
  for (int i = 0; i < 12; ++i) t.data<int32_t>()[i] = i;
  absl::StatusOr<Tensor> r = t.Reshape(Shape{3, 2, 2});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data<int32_t>()[11], 11);
  EXPECT_TRUE(r->SharesStorageWith(t));
  absl::StatusOr<Tensor> bad = t.Reshape(Shape{5});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("12 vs 5"), std::string::npos);
}

TEST(TensorTest, NarrowOfNarrowAccumulatesOffset) {
  Tensor t = *Tensor::Zeros(Shape{10, 2}, DType::kF32);
  for (int i = 0; i < 20; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor a = *t.Narrow(2, 6);
  Tensor b = *a.Narrow(1, 2);
  EXPECT_EQ(b.data<float>()[0], 6.0f);  // row 3 of t
}

TEST(TensorTest, ViewIntoFlatBuffer) {
  Tensor flat = *Tensor::Zeros(Shape{10}, DType::kF32);
  absl::StatusOr<Tensor> w = flat.View(4, Shape{2, 3});
  ASSERT_TRUE(w.ok());
  w->data<float>()[5] = 1.5f;
  EXPECT_EQ(flat.data<float>()[9], 1.5f);
  EXPECT_FALSE(flat.View(5, Shape{2, 3}).ok());
}

TEST(TensorTest, CloneIsDeep) {
  Tensor t = *Tensor::Zeros(Shape{3}, DType::kF32);
  Tensor c = *t.Clone();
  c.data<float>()[0] = 1.0f;
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  EXPECT_FALSE(c.SharesStorageWith(t));
}

TEST(TensorTest, CudaWithoutAllocatorIsAClearError) {
  if (GetAllocator(DeviceType::kCUDA) != nullptr) GTEST_SKIP() << "a CUDA allocator is linked";
  absl::StatusOr<Tensor> t = Tensor::Empty(Shape{4}, DType::kF32, Device::CUDA(0));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("cuda:0"), std::string::npos);
}

TEST(TensorTest, StorageOutlivesOriginalHandle) {
  Tensor view;
  {
    Tensor t = *Tensor::Zeros(Shape{8}, DType::kF32);
    t.data<float>()[7] = 3.0f;
    view = *t.Narrow(4, 4);
  }
  EXPECT_EQ(view.data<float>()[3], 3.0f);
  EXPECT_EQ(view.storage().use_count(), 1);
}

TEST(TensorTest, BorrowedStorageIsNotFreedAndBoundsAreChecked) {
  float owned[6] = {0, 1, 2, 3, 4, 5};
  {
    std::shared_ptr<Storage> s = Storage::Borrow(owned, sizeof(owned), Device::CPU());
    absl::StatusOr<Tensor> t = Tensor::FromStorage(s, 2 * sizeof(float), Shape{2, 2}, DType::kF32);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->data<float>()[0], 2.0f);
    t->data<float>()[3] = 9.0f;
    EXPECT_EQ(Tensor::FromStorage(s, 3 * sizeof(float), Shape{2, 2}, DType::kF32).status().code(),
              absl::StatusCode::kOutOfRange);
  }  // the borrowed block outlives the storage: nothing was freed
  EXPECT_EQ(owned[5], 9.0f);
}

TEST(TensorTest, ToCopiesBetweenHostTensors) {
  Tensor t = *Tensor::Zeros(Shape{2}, DType::kF32);
  t.data<float>()[1] = 4.0f;
  absl::StatusOr<Tensor> c = t.To(Device::CPU());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->SharesStorageWith(t));
  EXPECT_EQ(c->data<float>()[1], 4.0f);
}

}  // namespace
}  // namespace loom::core
