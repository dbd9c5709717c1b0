// Uses Loom from another workspace: @loom//core must build and work there.
#include "core/tensor.h"

#include "gtest/gtest.h"

TEST(EmbedTest, CoreTensorWorksFromAnotherWorkspace) {
  absl::StatusOr<loom::core::Tensor> t =
      loom::core::Tensor::Zeros(loom::core::Shape{2, 2}, loom::core::DType::kF32);
  ASSERT_TRUE(t.ok()) << t.status();
  t->data<float>()[3] = 4.0f;
  EXPECT_EQ(t->Narrow(1, 1)->data<float>()[1], 4.0f);
}
