// Linking //core/cuda:ops routes core/ops calls on cuda tensors to the CUDA
// kernels (and tensors' host copies through the caching allocator).

#include <cstring>

#include "core/cpu/test_util.h"
#include "core/cuda/test_util.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"

namespace loom::core::cuda {
namespace {

TEST(CudaOpsRegistrationTest, TableIsRegisteredWhenLinked) {
  absl::StatusOr<const ops::KernelTable*> table = ops::KernelsFor(Device::CUDA(0));
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_STREQ((*table)->name, "cuda");
}

TEST(CudaOpsRegistrationTest, OpsOnCudaTensorsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const Tensor a = cpu::testing::Random(Shape{33, 65}, 1), b = cpu::testing::Random(Shape{65, 17}, 2);
  Tensor want = *Tensor::Empty(Shape{33, 17}, DType::kF32);
  ASSERT_TRUE(ops::Matmul(a, b, &want).ok());
  absl::StatusOr<Tensor> da = a.To(Device::CUDA(0)), db = b.To(Device::CUDA(0));
  ASSERT_TRUE(da.ok() && db.ok()) << da.status() << db.status();
  Tensor dc = *Tensor::Empty(Shape{33, 17}, DType::kF32, Device::CUDA(0));
  ASSERT_TRUE(ops::Matmul(*da, *db, &dc).ok());
  absl::StatusOr<double> s = ops::SumSquares(dc);  // a host value: synchronises
  ASSERT_TRUE(s.ok()) << s.status();
  Tensor got = *dc.To(Device::CPU());
  EXPECT_LE(testing::RelError(got, want), 2e-5);
  double ws = 0;
  for (int i = 0; i < want.numel(); ++i) ws += double(want.data<float>()[i]) * want.data<float>()[i];
  EXPECT_NEAR(*s, ws, 1e-4 * ws);
}

}  // namespace
}  // namespace loom::core::cuda
