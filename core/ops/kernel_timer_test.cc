#include "core/ops/kernel_timer.h"

#include <cstring>

#include "core/cpu/test_util.h"
#include "core/ops/kernel_table.h"
#include "core/ops/ops.h"
#include "core/ops/testing/fake_device.h"
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

// The linear layer's fused GEMMs count their products too (the bench's GEMM
// share must not drop when their epilogues are on).
TEST(KernelTimerTest, LinearOpsCountTheirGemmFlops) {
  const Tensor x = Random(Shape{4, 16}, 1), w = Random(Shape{8, 16}, 2);
  const Tensor bias = Random(Shape{8}, 3), dy = Random(Shape{4, 8}, 4);
  Tensor y = *Tensor::Empty(Shape{4, 8}, DType::kF32);
  Tensor dx = *Tensor::Empty(Shape{4, 16}, DType::kF32);
  Tensor dw = *Tensor::Zeros(Shape{8, 16}, DType::kF32);
  auto timer = KernelTimer::Start();
  ASSERT_TRUE(timer.ok()) << timer.status();
  ASSERT_TRUE(LinearForward(x, w, bias, &y, nullptr, {}).ok());
  ASSERT_TRUE(LinearBackwardData(dy, w, Tensor(), &dx, nullptr, {}).ok());
  ASSERT_TRUE(LinearBackwardWeight(dy, x, &dw, nullptr, {}).ok());
  const std::vector<KernelTime> totals = (*timer)->Totals();
  for (const char* op : {"linear_forward", "linear_backward_data", "linear_backward_weight"}) {
    const KernelTime* t = Find(totals, op);
    ASSERT_NE(t, nullptr) << op;
    EXPECT_EQ(t->flops, 2.0 * 4 * 8 * 16) << op;
  }
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

// The device path: the kernels of a device's table, timed by its kernel
// clock (the fake device's is the host clock; CUDA's records events), and
// the device's own table back afterwards.
TEST(KernelTimerTest, TimesADevicesKernelsThroughItsClock) {
  testing::ScopedFakeDevice device;
  const Device gpu = Device::CUDA(0);
  const KernelTable* untimed = *KernelsFor(gpu);
  const Tensor a = *Random(Shape{4, 16}, 1).To(gpu);
  const Tensor b = *Random(Shape{16, 8}, 2).To(gpu);
  Tensor c = *Tensor::Empty(Shape{4, 8}, DType::kF32, gpu);
  {
    auto timer = KernelTimer::Start(DeviceType::kCUDA);
    ASSERT_TRUE(timer.ok()) << timer.status();
    EXPECT_NE(*KernelsFor(gpu), untimed);
    ASSERT_TRUE(Matmul(a, b, &c).ok());
    ASSERT_TRUE(Matmul(a, b, &c).ok());
    ASSERT_TRUE(Zero(&c).ok());
    const std::vector<KernelTime> totals = (*timer)->Totals();
    const KernelTime* mm = Find(totals, "matmul");
    ASSERT_NE(mm, nullptr);
    EXPECT_EQ(mm->calls, 2);
    EXPECT_EQ(mm->flops, 2.0 * 2 * 4 * 8 * 16);
    EXPECT_GT(mm->seconds, 0);
    ASSERT_NE(Find(totals, "zero"), nullptr);
    // CPU kernels are not timed by a device timer.
    Tensor h = *Tensor::Empty(Shape{4, 8}, DType::kF32);
    ASSERT_TRUE(Matmul(*Random(Shape{4, 16}, 3).To(Device::CPU()), *Random(Shape{16, 8}, 4).To(Device::CPU()), &h).ok());
    EXPECT_EQ(Find((*timer)->Totals(), "matmul")->calls, 2);
  }
  EXPECT_EQ(*KernelsFor(gpu), untimed);
}

TEST(KernelTimerTest, DeviceWithoutKernelsOrClockIsRefused) {
  // No CUDA table is registered in this test binary outside a ScopedFakeDevice.
  auto timer = KernelTimer::Start(DeviceType::kCUDA);
  EXPECT_EQ(timer.status().code(), absl::StatusCode::kFailedPrecondition);
  auto cpu = KernelTimer::Start();  // the refusal left no timer running
  EXPECT_TRUE(cpu.ok()) << cpu.status();
}

}  // namespace
}  // namespace loom::core::ops
