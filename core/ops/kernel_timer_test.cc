#include "core/ops/kernel_timer.h"

#include <cstring>

#include "core/cpu/test_util.h"
#include "core/ops/kernel_table.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"

namespace loom::core::ops {
namespace {

using cpu::testing::Random;

const KernelTime* Find(const std::vector<KernelTime>& totals, const char* kernel) {
  for (const KernelTime& t : totals) {
    if (t.kernel == kernel) return &t;
  }
  return nullptr;
}

TEST(KernelTimerTest, CountsCallsTimeAndGemmFlopsAndLeavesResultsAlone) {
  const Tensor a = Random(Shape{4, 16}, 1);
  const Tensor b = Random(Shape{8, 16}, 2);  // used transposed: [16, 8]
  Tensor untimed = *Tensor::Empty(Shape{4, 8}, DType::kF32);
  ASSERT_TRUE(Matmul(a, b, &untimed, {.trans_b = true}).ok());

  auto timer = KernelTimer::Start();
  ASSERT_TRUE(timer.ok()) << timer.status();
  Tensor c = *Tensor::Empty(Shape{4, 8}, DType::kF32);
  ASSERT_TRUE(Matmul(a, b, &c, {.trans_b = true}).ok());
  ASSERT_TRUE(Matmul(a, b, &c, {.trans_b = true}).ok());
  const Tensor x = Random(Shape{3, 2, 5}, 3);
  const Tensor y = Random(Shape{3, 5, 7}, 4);
  Tensor z = *Tensor::Empty(Shape{3, 2, 7}, DType::kF32);
  ASSERT_TRUE(BatchedMatmul(x, y, &z).ok());
  Tensor sum = *Tensor::Empty(Shape{4, 8}, DType::kF32);
  ASSERT_TRUE(Add(c, c, &sum).ok());
  // A refused call still reports the kernel's own error through the timer.
  Tensor wrong = *Tensor::Empty(Shape{5, 8}, DType::kF32);
  EXPECT_EQ(Matmul(a, b, &wrong, {.trans_b = true}).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(std::memcmp(c.data<float>(), untimed.data<float>(), c.nbytes()), 0);
  const std::vector<KernelTime> totals = (*timer)->Totals();
  const KernelTime* mm = Find(totals, "matmul");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->calls, 3);
  EXPECT_EQ(mm->flops, 2.0 * 2 * 4 * 8 * 16);  // the refused call counts no flops
  EXPECT_GT(mm->seconds, 0);
  const KernelTime* bmm = Find(totals, "batched_matmul");
  ASSERT_NE(bmm, nullptr);
  EXPECT_EQ(bmm->calls, 1);
  EXPECT_EQ(bmm->flops, 2.0 * 3 * 2 * 7 * 5);
  const KernelTime* add = Find(totals, "add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->calls, 1);
  EXPECT_EQ(add->flops, 0);
  EXPECT_EQ(Find(totals, "layernorm_forward"), nullptr);  // never called: not listed
  for (size_t i = 1; i < totals.size(); ++i) EXPECT_GE(totals[i - 1].seconds, totals[i].seconds);

  (*timer)->Reset();
  EXPECT_TRUE((*timer)->Totals().empty());
}

TEST(KernelTimerTest, OneAtATimeAndTheBuiltInTableComesBack) {
  {
    auto timer = KernelTimer::Start();
    ASSERT_TRUE(timer.ok()) << timer.status();
    EXPECT_NE(*KernelsFor(Device::CPU()), BuiltInCpuKernels());
    auto second = KernelTimer::Start();
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(*KernelsFor(Device::CPU()), BuiltInCpuKernels());
  auto again = KernelTimer::Start();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->Totals().empty());  // a new timer starts from zero
}

}  // namespace
}  // namespace loom::core::ops
